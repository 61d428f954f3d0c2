"""Read the site's facts and model prices once, for every document that shows them."""

from __future__ import annotations

import datetime as dt
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

from .settings import PACKAGE

CONTENT_DIR: Final = PACKAGE / "content"
# The optional submit fields a model may or may not take (its row's `fields`).
OPTIONAL_FIELDS: Final = ("negative_prompt", "seed", "reference")


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
    # Which of OPTIONAL_FIELDS the model takes; submit refuses the others.
    fields: tuple[str, ...] = ()

    def retired(self, today: dt.date) -> bool:
        """Tell whether the vendor has retired this model by that day."""
        return self.retires_at is not None and today >= self.retires_at

    def refused_field(self, asked: Mapping[str, Any]) -> str | None:
        """Name a submitted optional field this model cannot take (blank is none)."""
        for name in OPTIONAL_FIELDS:
            if name in self.fields or name not in asked:
                continue
            value = asked[name]
            blank = isinstance(value, str) and not value.strip()
            if name == "negative_prompt" and blank:
                continue
            return name
        return None


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
        models=tuple(_model(row) for row in models),
        packs=packs,
    )


def _model(row: Mapping[str, Any]) -> Model:
    """One row of models.toml, its `fields` checked against what submit knows."""
    fields = tuple(row.get("fields", ()))
    unknown = sorted(set(fields) - set(OPTIONAL_FIELDS))
    if unknown:
        raise ValueError(f"models.toml: {row['id']}: unknown fields {unknown}")
    if ("reference" in fields) != row["accepts_reference"]:
        raise ValueError(
            f"models.toml: {row['id']}: accepts_reference disagrees with fields"
        )
    return Model(**{**row, "sizes": tuple(row["sizes"]), "fields": fields})
