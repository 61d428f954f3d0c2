"""Read the site's facts and model prices once, checked, for everything that shows them.

The packaged content/ or the operator's own directory (setting content_dir)
replacing it as a whole: either is read and checked at start-up, and a fault
stops it with one line naming the file, the entry and the problem.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal, cast

from email_validator import EmailNotValidError, validate_email

from .settings import Settings, SettingsError, resource_dir

CONTENT_DIR: Final = resource_dir("content")
# Model ids travel in URLs, JSON and Redis keys.
_MODEL_ID: Final = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
_SIZE: Final = re.compile(r"[1-9][0-9]{1,4}x[1-9][0-9]{1,4}")
_SITE_TEXTS: Final = ("name", "name_zh", "name_en", "operator_zh", "operator_en")
_SITE_EMAILS: Final = ("contact_email", "support_email", "privacy_email")
# The optional submit fields a model may or may not take (its row's `fields`).
OPTIONAL_FIELDS: Final = ("negative_prompt", "seed", "reference")
# Our fields a workflow's node inputs can take (a comfyui row's `inputs`).
WORKFLOW_FIELDS: Final = (
    "prompt", "negative_prompt", "seed", "width", "height", "count", "reference",
)  # fmt: skip


class ContentError(SettingsError):
    """A content file is missing or malformed; the message names file and entry."""


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
    # The longest prompt its upstream takes (with a preset's suffix), in
    # characters; None: our own bound on the person's words is the only one.
    max_prompt: int | None = None
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
class Preset:
    """A style a person starts from: words added to their prompt (presets.toml)."""

    id: str
    name_zh: str
    name_en: str
    prompt_suffix: str
    negative_prompt: str = ""


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
    # The style presets of Create, in the order of presets.toml (none without it).
    presets: tuple[Preset, ...] = ()
    # The models by id, built once: a submit looks its model up.
    _by_id: Mapping[str, Model] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_id", {model.id: model for model in self.models})

    def model(self, model_id: str) -> Model | None:
        """Return the model of that id, retired or not, if there is one."""
        return self._by_id.get(model_id)

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
    """Parse and check site.toml and models.toml into typed records."""
    site_file, models_file = directory / "site.toml", directory / "models.toml"
    site = _Table(site_file, "", _read(site_file))
    documents = _documents(site_file, site.take("documents", dict))
    packs = _packs(site_file, site.take("packs", list))
    facts: dict[str, Any] = {key: site.text(key) for key in _SITE_TEXTS}
    facts |= {key: site.email(key) for key in _SITE_EMAILS}
    facts["credits_per_yuan"] = site.positive("credits_per_yuan")
    summary = _Table(site_file, "summary", site.take("summary", dict))
    facts["summary"] = {"zh": summary.text("zh"), "en": summary.text("en")}
    summary.done()
    site.done()
    catalogue = _Table(models_file, "", _read(models_file))
    models = _models(models_file, catalogue.take("models", list))
    catalogue.done()
    workflows = {
        model.workflow: _workflow(directory, models_file, model)
        for model in models
        if model.workflow
    }
    return Content(
        site=facts, documents=documents, models=models, packs=packs,
        workflows=workflows, presets=_presets(directory / "presets.toml"),
    )  # fmt: skip


def content_for(settings: Settings) -> Content:
    """Load the content the settings name, every model on a configured upstream."""
    directory = settings.content_dir or CONTENT_DIR
    content = load_content(directory)
    upstreams = settings.workbench.upstreams
    for index, model in enumerate(content.models):
        if model.upstream not in upstreams:
            raise ContentError(
                f"{directory / 'models.toml'}: {_model_entry(index, model.id)}:"
                f" upstream: {model.upstream!r} is not configured (the settings"
                f" have no [upstreams.{model.upstream}]; they have"
                f" {', '.join(sorted(upstreams)) or 'none'})"
            )
    return content


def _read(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as file:
            return tomllib.load(file)
    except OSError as err:
        raise ContentError(f"{path}: cannot read: {err.strerror}") from None
    except tomllib.TOMLDecodeError as err:
        raise ContentError(f"{path}: not valid TOML: {err}") from None
    except UnicodeDecodeError as err:  # TOML is UTF-8 (tomllib decodes it whole)
        raise ContentError(f"{path}: not UTF-8: byte {err.start}") from None


class _Table:
    """One table of a content file, read key by key; leftovers are unknown keys."""

    def __init__(self, file: Path, entry: str, table: Any) -> None:
        self._file, self._entry = file, entry
        if not isinstance(table, dict):
            raise self.error("", "must be a table")
        self._left = dict(table)

    def error(self, key: str, problem: str) -> ContentError:
        """Name the file, the entry and the key with the problem."""
        where = ": ".join(part for part in (self._entry, key) if part)
        return ContentError(f"{self._file}: {where}: {problem}")

    def has(self, key: str) -> bool:
        """Tell whether the table holds a key not read yet."""
        return key in self._left

    def take(self, key: str, kind: type[Any], missing: str = "missing") -> Any:
        """Return a key's value of the given TOML type."""
        if key not in self._left:
            raise self.error(key, missing)
        value = self._left.pop(key)
        # bool is an int, datetime a date: neither stands for the other here.
        if not isinstance(value, kind) or (
            isinstance(value, bool) != (kind is bool) or isinstance(value, dt.datetime)
        ):
            raise self.error(key, f"must be {_NAMES[kind]}, not {value!r}")
        return value

    def text(self, key: str) -> str:
        """Return a non-empty string."""
        value = cast(str, self.take(key, str)).strip()
        if not value:
            raise self.error(key, "must not be empty")
        return value

    def email(self, key: str) -> str:
        """Return an e-mail address."""
        value = self.text(key)
        try:
            validate_email(value, check_deliverability=False)
        except EmailNotValidError as err:
            raise self.error(key, f"not an e-mail address: {err}") from None
        return value

    def positive(self, key: str, missing: str = "missing", low: int = 1) -> int:
        """Return an integer of at least 1 (or `low`)."""
        value = cast(int, self.take(key, int, missing))
        if value < low:
            wanted = "a positive integer" if low == 1 else f"an integer >= {low}"
            raise self.error(key, f"must be {wanted}, not {value}")
        return value

    def date(self, key: str) -> dt.date:
        """Return a TOML date (YYYY-MM-DD, unquoted)."""
        return cast(dt.date, self.take(key, dt.date))

    def done(self) -> None:
        """Refuse a key nobody reads: a typo would otherwise pass unnoticed."""
        if self._left:
            raise self.error(next(iter(self._left)), "unknown key")


_NAMES: Final[Mapping[type[Any], str]] = {
    str: "a string",
    int: "an integer",
    bool: "true or false",
    dt.date: "a date (YYYY-MM-DD, unquoted)",
    dict: "a table",
    list: "an array",
}


@functools.cache
def _published_documents() -> dict[str, tuple[str, str, bool]]:
    """Return the service's documents: name -> path, lang, shows an effective date."""
    documents = _read(CONTENT_DIR / "site.toml")["documents"]
    return {
        name: (doc["path"], doc["lang"], "effective" in doc)
        for name, doc in documents.items()
    }


def _documents(file: Path, tables: dict[str, Any]) -> dict[str, DocumentMeta]:
    """Read the dates of the documents; their routes and templates are the service's."""
    published = _published_documents()
    if unknown := sorted(tables.keys() - published.keys()):
        raise ContentError(
            f"{file}: documents.{unknown[0]}: unknown document (the service publishes"
            f" {', '.join(published)})"
        )
    documents = {}
    for name, (path, lang, dated) in published.items():
        if name not in tables:
            raise ContentError(f"{file}: documents.{name}: missing")
        table = _Table(file, f"documents.{name}", tables[name])
        for key, wanted in (("path", path), ("lang", lang)):
            if (value := table.text(key)) != wanted:
                raise table.error(key, f"must be {wanted!r}, not {value!r}")
        updated = table.date("updated")
        effective = None
        if dated:  # its text shows the day it took effect
            effective = table.date("effective")
        elif table.has("effective"):
            raise table.error("effective", "this document shows no effective date")
        table.done()
        documents[name] = DocumentMeta(name, path, lang, updated, effective)
    return documents


def _packs(file: Path, tables: list[Any]) -> tuple[Pack, ...]:
    """Read the credit packs; a pack's id is "p" + its price, so prices differ."""
    packs: list[Pack] = []
    for index, item in enumerate(tables):
        table = _Table(file, f"packs[{index}]", item)
        yuan = table.positive("yuan", "missing (the price in yuan)")
        pack = Pack(yuan, table.positive("credits"), table.positive("bonus", low=0))
        table.done()
        if any(other.yuan == yuan for other in packs):
            raise table.error("yuan", f"{yuan} is the price of another pack")
        packs.append(pack)
    return tuple(packs)


def _presets(file: Path) -> tuple[Preset, ...]:
    """Read presets.toml's [[presets]]; a content directory without it has none."""
    if not file.exists():
        return ()
    top = _Table(file, "", _read(file))
    presets: list[Preset] = []
    for index, raw in enumerate(top.take("presets", list)):
        table = _Table(file, f"presets[{index}]", raw)
        preset_id = table.text("id")
        if not _MODEL_ID.fullmatch(preset_id) or preset_id in {p.id for p in presets}:
            raise table.error("id", "must be a unique id of a-z, 0-9, . _ -")
        presets.append(
            Preset(
                id=preset_id,
                name_zh=table.text("name_zh"),
                name_en=table.text("name_en"),
                prompt_suffix=table.text("prompt_suffix"),
                negative_prompt=(
                    table.text("negative_prompt")
                    if table.has("negative_prompt")
                    else ""
                ),
            )
        )
        table.done()
    top.done()
    return tuple(presets)


def _model_entry(index: int, model_id: Any) -> str:
    """Name a model's entry by its place and, when it has one, its id."""
    named = isinstance(model_id, str) and model_id
    return f"models[{index}]" + (f' (id "{model_id}")' if named else "")


def _models(file: Path, tables: list[Any]) -> tuple[Model, ...]:
    """Read the catalogue: ids unique, prices positive, sizes the API accepts."""
    if not tables:
        raise ContentError(f"{file}: models: the workbench needs at least one")
    models: list[Model] = []
    for index, item in enumerate(tables):
        model_id = item.get("id") if isinstance(item, dict) else None
        table = _Table(file, _model_entry(index, model_id), item)
        model = _model(table)
        table.done()
        if any(other.id == model.id for other in models):
            raise table.error("id", f"{model.id!r} is the id of another model")
        models.append(model)
    return tuple(models)


def _model(table: _Table) -> Model:
    model_id = table.text("id")
    if not _MODEL_ID.fullmatch(model_id):
        raise table.error(
            "id", "must be 1-64 lower-case letters, digits, '.', '_' or '-'"
        )
    kind = table.text("kind")
    if kind not in ("image", "video"):
        raise table.error("kind", f"must be 'image' or 'video', not {kind!r}")
    seconds = None
    if kind == "video":
        seconds = table.positive("seconds", "missing (a video's length)")
    elif table.has("seconds"):
        raise table.error("seconds", "only a video model has seconds")
    sizes = tuple(table.take("sizes", list))
    if not sizes or not all(isinstance(s, str) and _SIZE.fullmatch(s) for s in sizes):
        raise table.error("sizes", "must be a non-empty array like ['1024x1024']")
    if len(set(sizes)) != len(sizes):
        raise table.error("sizes", "lists a size twice")
    max_count = table.positive("max_count")
    if kind == "video" and max_count != 1:
        raise table.error("max_count", "must be 1 for a video model")
    accepts = cast(bool, table.take("accepts_reference", bool))
    return Model(
        id=model_id,
        name=table.text("name"),
        vendor=table.text("vendor"),
        kind=cast(Literal["image", "video"], kind),
        credits=table.positive("credits"),
        max_resolution=table.text("max_resolution"),
        note_zh=table.text("note_zh"),
        note_en=table.text("note_en"),
        sizes=sizes,
        max_count=max_count,
        accepts_reference=accepts,
        upstream=table.text("upstream"),
        upstream_model=table.text("upstream_model"),
        seconds=seconds,
        retires_at=table.date("retires_at") if table.has("retires_at") else None,
        fields=_fields(table, accepts),
        max_prompt=table.positive("max_prompt") if table.has("max_prompt") else None,
        workflow=table.text("workflow") if table.has("workflow") else None,
        inputs=_inputs(table),
    )


def _fields(table: _Table, accepts_reference: bool) -> tuple[str, ...]:
    """A row's `fields`: known optional fields, `reference` as accepts_reference."""
    fields = tuple(table.take("fields", list)) if table.has("fields") else ()
    if not all(isinstance(name, str) for name in fields):
        raise table.error("fields", "must be an array of field names")
    if unknown := sorted(set(fields) - set(OPTIONAL_FIELDS)):
        raise table.error(
            "fields", f"unknown fields {unknown} (known: {', '.join(OPTIONAL_FIELDS)})"
        )
    if ("reference" in fields) != accepts_reference:
        raise table.error("fields", "has 'reference' exactly when accepts_reference")
    return fields


def _inputs(table: _Table) -> tuple[tuple[str, str], ...]:
    """A comfyui row's `inputs`: our field -> "<node id>.<input name>"."""
    inputs = table.take("inputs", dict) if table.has("inputs") else {}
    if unknown := sorted(set(inputs) - set(WORKFLOW_FIELDS)):
        raise table.error("inputs", f"unknown inputs {unknown}")
    if not all(isinstance(target, str) and "." in target for target in inputs.values()):
        raise table.error("inputs", 'each must be "<node id>.<input name>"')
    return tuple(sorted(inputs.items()))


def _workflow(directory: Path, file: Path, model: Model) -> Mapping[str, Any]:
    """Read a row's workflow; every input it maps must be a node's input."""
    name = model.workflow or ""
    if "/" in name or "\\" in name or not name.endswith(".json"):
        raise ContentError(f"{file}: {model.id}: workflow: must be a .json file name")
    path = directory / "workflows" / name
    try:
        graph = json.loads(path.read_bytes())
    except OSError as err:
        raise ContentError(f"{path}: cannot read: {err.strerror}") from None
    except ValueError:
        raise ContentError(f"{path}: not JSON") from None
    if not isinstance(graph, dict):
        raise ContentError(f"{path}: not a graph in ComfyUI's API format")
    for field_name, target in model.inputs:
        node, _, key = target.partition(".")
        inputs = (
            graph.get(node, {}).get("inputs")
            if isinstance(graph.get(node), dict)
            else None
        )
        if not isinstance(inputs, dict) or key not in inputs:
            raise ContentError(
                f"{file}: {model.id}: inputs: {field_name} -> {target}: no such input"
                f" in {name}"
            )
    return graph
