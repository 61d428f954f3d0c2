"""Read the site's facts and model prices once, for every document that shows them."""

from __future__ import annotations

import datetime as dt
import json
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

from .settings import PACKAGE

CONTENT_DIR: Final = PACKAGE / "content"
# The optional submit fields a model may or may not take (its row's `fields`).
OPTIONAL_FIELDS: Final = ("negative_prompt", "seed", "reference")
# Our fields a workflow's node inputs can take (a comfyui row's `inputs`).
WORKFLOW_FIELDS: Final = (
    "prompt", "negative_prompt", "seed", "width", "height", "count", "reference",
)  # fmt: skip


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
    # A comfyui model: its workflow file (content/workflows/) and which of our
    # fields goes to which "<node id>.<input name>".
    workflow: str | None = None
    inputs: tuple[tuple[str, str], ...] = ()

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
    # The workflows comfyui rows name, parsed (ComfyUI's API format), by file name.
    workflows: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

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
    rows = tuple(_model(row) for row in models)
    return Content(
        site=site,
        documents=documents,
        models=rows,
        packs=packs,
        workflows={
            row.workflow: _workflow(directory, row) for row in rows if row.workflow
        },
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
    inputs = tuple(sorted(row.get("inputs", {}).items()))
    unknown = sorted({name for name, _ in inputs} - set(WORKFLOW_FIELDS))
    if unknown:
        raise ValueError(f"models.toml: {row['id']}: unknown inputs {unknown}")
    return Model(
        **{**row, "sizes": tuple(row["sizes"]), "fields": fields, "inputs": inputs}
    )


def _workflow(directory: Path, model: Model) -> Mapping[str, Any]:
    """Read a row's workflow; every input it maps must be a node's input."""
    name = model.workflow or ""
    if "/" in name or "\\" in name or not name.endswith(".json"):
        raise ValueError(f"models.toml: {model.id}: workflow must be a file name")
    with (directory / "workflows" / name).open("rb") as file:
        graph = json.load(file)
    for field_name, target in model.inputs:
        node, _, key = target.partition(".")
        inputs = graph.get(node, {}).get("inputs") if isinstance(graph, dict) else None
        if not isinstance(inputs, dict) or key not in inputs:
            raise ValueError(
                f"models.toml: {model.id}: {field_name} -> {target}: no such input"
            )
    if not isinstance(graph, dict):
        raise ValueError(f"workflows/{name}: not a graph in API format")
    return graph
