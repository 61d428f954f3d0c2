"""Read the site's facts and model prices once, for every document that shows them."""

from __future__ import annotations

import datetime as dt
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

from .settings import resource_dir

CONTENT_DIR: Final = resource_dir("content")


@dataclass(frozen=True, slots=True)
class DocumentMeta:
    """Where a document lives, its language and when its text last changed."""

    name: str
    path: str
    lang: str
    updated: dt.date
    effective: dt.date | None


@dataclass(frozen=True, slots=True)
class Model:
    id: str
    name: str
    vendor: str
    kind: Literal["image", "video"]
    credits: int
    max_resolution: str
    note_zh: str
    note_en: str
    sizes: tuple[str, ...]
    max_count: int
    accepts_reference: bool
    upstream: str
    upstream_model: str
    seconds: int | None = None
    retires_at: dt.date | None = None

    def retired(self, today: dt.date) -> bool:
        """Tell whether the vendor has retired this model by that day."""
        return self.retires_at is not None and today >= self.retires_at


@dataclass(frozen=True, slots=True)
class Pack:
    yuan: int
    credits: int
    bonus: int


@dataclass(frozen=True, slots=True)
class Content:
    """Everything under content/, parsed."""

    site: dict[str, Any]
    documents: dict[str, DocumentMeta]
    models: tuple[Model, ...]
    packs: tuple[Pack, ...]

    @property
    def lastmod(self) -> dt.date:
        """Return the newest change of any document."""
        return max(meta.updated for meta in self.documents.values())

    def offered(self, today: dt.date) -> tuple[Model, ...]:
        """Return the models still on offer that day: none past its retires_at."""
        return tuple(model for model in self.models if not model.retired(today))

    def next_retirement(self, today: dt.date) -> dt.date | None:
        """Return the first day after `today` on which a model retires, if any."""
        later = [
            m.retires_at for m in self.models if m.retires_at and m.retires_at > today
        ]
        return min(later, default=None)


def load_content(directory: Path = CONTENT_DIR) -> Content:
    """Parse site.toml and models.toml into typed records."""
    with (directory / "site.toml").open("rb") as file:
        site = tomllib.load(file)
    with (directory / "models.toml").open("rb") as file:
        models = tomllib.load(file)["models"]
    documents = {
        name: DocumentMeta(
            name=name,
            path=entry["path"],
            lang=entry["lang"],
            updated=entry["updated"],
            effective=entry.get("effective"),
        )
        for name, entry in site.pop("documents").items()
    }
    packs = tuple(Pack(**pack) for pack in site.pop("packs"))
    return Content(
        site=site,
        documents=documents,
        models=tuple(
            Model(**{**model, "sizes": tuple(model["sizes"])}) for model in models
        ),
        packs=packs,
    )
