"""The operator's own content directory: followed everywhere, refused when wrong."""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from bs4 import BeautifulSoup
from lxml import etree

from service.content import CONTENT_DIR, ContentError, content_for, load_content
from service.store.embedded import MailCatcher

from .conftest import TEST_SECRET, Env, MakeClient, SettingsFactory
from .processes import studio_environ
from .workbench import balance, sign_in, wait_for_status, worker_process

MARKDOWN = {"Accept": "text/markdown"}
# A model the packaged catalogue does not have, on an upstream the settings have.
ADDED_MODEL = """
[[models]]
id = "operator-image"
name = "Operator Image One"
vendor = "Operator Labs"
kind = "image"
credits = 3
max_resolution = "1024×1024"
note_zh = "运营方自己加的模型。"
note_en = "A model the operator added."
sizes = ["1024x1024"]
max_count = 2
accepts_reference = false
upstream = "fal"
upstream_model = "fal-ai/operator/image"
"""


def edit(path: Path, old: str, new: str) -> None:
    """Change one place of an operator's file, as they would in an editor."""
    text = path.read_text()
    assert text.count(old) == 1, f"{old!r} is not once in {path.name}"
    path.write_text(text.replace(old, new))


def drop_model(path: Path, model_id: str) -> None:
    """Take one model's [[models]] table out of models.toml."""
    head, *tables = path.read_text().split("\n[[models]]\n")
    kept = [t for t in tables if f'\nid = "{model_id}"\n' not in "\n" + t]
    assert len(kept) == len(tables) - 1
    path.write_text("\n[[models]]\n".join([head, *kept]))


def own_copy(tmp_path: Path) -> Path:
    """Start an operator directory from the packaged copy (docs/content.md)."""
    directory = tmp_path / "content"
    shutil.copytree(CONTENT_DIR, directory)
    return directory


@pytest.fixture
def operator_dir(tmp_path: Path) -> Path:
    """An operator's directory: one price changed, one model gone, one added."""
    directory = own_copy(tmp_path)
    models, site = directory / "models.toml", directory / "site.toml"
    edit(models, 'kind = "image"\ncredits = 6\n', 'kind = "image"\ncredits = 9\n')
    drop_model(models, "flux-kontext-pro")
    models.write_text(models.read_text() + ADDED_MODEL)
    edit(
        site,
        "yuan = 30\ncredits = 300\nbonus = 0",
        "yuan = 50\ncredits = 500\nbonus = 5",
    )
    edit(
        site,
        'path = "/"\nlang = "zh-Hans"\nupdated = 2026-11-18',
        'path = "/"\nlang = "zh-Hans"\nupdated = 2026-11-24',
    )
    return directory


def _price_cells(html: str) -> dict[str, str]:
    """Map each model's name to its price cell in a home page's model table."""
    table = BeautifulSoup(html, "html.parser").select("main table")[0]
    rows = [row.find_all("td") for row in table.select("tbody tr")]
    return {cells[0].get_text(): cells[3].get_text() for cells in rows}


def _markdown_rows(markdown: str) -> dict[str, str]:
    """Map each model's name to its price cell in a home page's Markdown table."""
    lines = [line for line in markdown.splitlines() if line.startswith("| ")]
    table = [[cell.strip() for cell in line.strip("| ").split(" | ")] for line in lines]
    # The model table is the one of six columns; its header and separator go first.
    rows = [cells for cells in table if len(cells) == 6][2:]
    return {
        cells[0].replace("\\[", "[").replace("\\]", "]"): cells[3] for cells in rows
    }


async def test_an_operator_directory_is_what_every_page_and_list_shows(
    studio: MakeClient, operator_dir: Path
) -> None:
    """Home pages (HTML and Markdown), llms.txt, the lists and the sitemap agree."""
    client = await studio(STUDIO_CONTENT_DIR=str(operator_dir))
    today = dt.datetime.now(dt.UTC).date()
    offered = load_content(operator_dir).offered(today)
    names = [model.name for model in offered]
    assert "Operator Image One" in names
    assert "Seedream 4.0" in names
    assert "FLUX.1 Kontext [pro]" not in names
    zh = {
        m.name: f"{m.credits} 积分 / {'张' if m.kind == 'image' else '条'}"
        for m in offered
    }
    en = {m.name: f"{m.credits} credits per" for m in offered}
    assert zh["Seedream 4.0"] == "9 积分 / 张"

    for path, prices in (("/", zh), ("/en", en)):
        html = await (await client.get(path)).text()
        cells = _price_cells(html)
        assert list(cells) == names, path
        assert all(cells[name].startswith(prices[name]) for name in names), cells
        markdown = await (await client.get(path, headers=MARKDOWN)).text()
        rows = _markdown_rows(markdown)
        assert list(rows) == names, path
        assert all(rows[name].startswith(prices[name]) for name in names), rows
        assert "FLUX.1 Kontext" not in html + markdown
        assert "¥50" in html or "CNY 50" in html

    llms = await (await client.get("/llms.txt")).text()
    listed = re.findall(r"^- \[(.+?)\]\(.+?/en\): .+?, (\d+) credits per", llms, re.M)
    assert listed == [
        (m.name.replace("[", "(").replace("]", ")"), str(m.credits)) for m in offered
    ]

    body: dict[str, Any] = await (await client.get("/api/models")).json()
    shown = [(m["id"], m["credits"]) for m in body["models"]]
    assert shown == [(m.id, m.credits) for m in load_content(operator_dir).models]
    assert ("seedream-4", 9) in shown
    assert ("operator-image", 3) in shown
    packs = (await (await client.get("/api/packs")).json())["packs"]
    assert packs[0] == {"id": "p50", "yuan": 50, "credits": 500, "bonus": 5}
    # the terms and the refund policy name the operator's packs, not ours
    for path, phrase in (
        ("/terms", "50 元 500 积分另赠 5 积分"),
        ("/terms", "50 yuan for 500 credits plus 5 bonus credits"),
        ("/refund", "50 元 500 积分"),
        ("/refund", "5 with the 50 yuan pack"),
    ):
        for accept in ({}, MARKDOWN):
            document = await (await client.get(path, headers=accept)).text()
            assert phrase in document, (path, accept, phrase)
            assert "30 元 300 积分" not in document
            assert "30 yuan for 300" not in document

    sitemap = etree.fromstring(await (await client.get("/sitemap.xml")).read())
    space = {"s": "http://www.sitemaps.org/schemas/sitemap/0.9"}
    lastmod = "string(//s:url[s:loc='http://127.0.0.1:8080/']/s:lastmod)"
    assert sitemap.xpath(lastmod, namespaces=space) == "2026-11-24"


async def test_a_worker_runs_and_charges_the_operators_models(
    studio: MakeClient, studio_env: Env, operator_dir: Path, mail_server: MailCatcher
) -> None:
    """A model only the operator's catalogue has runs on a worker, at its price."""
    variables = {**studio_env, "STUDIO_CONTENT_DIR": str(operator_dir)}
    client = await studio(STUDIO_CONTENT_DIR=str(operator_dir))
    await sign_in(client, mail_server)
    before = await balance(client)
    response = await client.post(
        "/api/generations",
        json={"model": "operator-image", "prompt": "a lamp", "count": 2},
    )
    assert response.status == 202, await response.text()
    generation = await response.json()
    assert generation["credits"] == 6
    with worker_process(variables):
        done = await wait_for_status(client, generation["id"], {"succeeded"})
    assert len(done["works"]) == 2
    assert await balance(client) == before - 6
    response = await client.post(
        "/api/generations", json={"model": "flux-kontext-pro", "prompt": "a lamp"}
    )
    assert response.status == 400


def test_the_packaged_content_passes_its_own_checks(
    make_settings: SettingsFactory,
) -> None:
    """Every model of the packaged catalogue is on an upstream of default.toml."""
    content = content_for(make_settings())
    assert content == load_content()
    assert content.models
    assert content.packs


def test_a_model_is_found_by_its_id_in_what_the_content_holds_now() -> None:
    """The lookup follows the models: a copy with other models finds those."""
    content = load_content()
    first, *others = content.models
    assert content.model(first.id) is first
    assert content.model("no-such-model") is None
    fewer = dataclasses.replace(content, models=tuple(others))
    assert fewer.model(first.id) is None
    assert fewer.model(others[0].id) is others[0]


def test_an_empty_setting_means_the_packaged_content(
    make_settings: SettingsFactory, tmp_path: Path
) -> None:
    """content_dir empty: the packaged copy; set: that directory, absolute."""
    assert make_settings().content_dir is None
    directory = own_copy(tmp_path)
    assert make_settings(STUDIO_CONTENT_DIR=str(directory)).content_dir == directory


Breaker = Callable[[Path], None]


def _missing_models(directory: Path) -> None:
    (directory / "models.toml").unlink()


def _editing(name: str, old: str, new: str) -> Breaker:
    return lambda directory: edit(directory / name, old, new)


def _not_utf8(name: str) -> Breaker:
    def breaker(directory: Path) -> None:
        (directory / name).write_bytes(b'x = "\xff"\n')

    return breaker


SEEDREAM = 'models[0] (id "seedream-4")'
# (how the operator's directory goes wrong, the file, what the line says after it)
BAD_CASES: list[tuple[str, Breaker, str, str]] = [
    ("missing-file", _missing_models, "models.toml", "cannot read: No such file"),
    (
        "bad-toml",
        _editing("site.toml", "credits_per_yuan = 10", "credits_per_yuan = = 10"),
        "site.toml",
        "not valid TOML",
    ),
    (
        "unknown-key",
        _editing("models.toml", "credits = 6\n", 'credits = 6\ncolour = "red"\n'),
        "models.toml",
        f"{SEEDREAM}: colour: unknown key",
    ),
    (
        "unconfigured-upstream",
        _editing("models.toml", 'upstream = "replicate"', 'upstream = "azure"'),
        "models.toml",
        "models[4] (id \"hailuo-02\"): upstream: 'azure' is not configured",
    ),
    (
        "zero-price",
        _editing("models.toml", "credits = 6\n", "credits = 0\n"),
        "models.toml",
        f"{SEEDREAM}: credits: must be a positive integer, not 0",
    ),
    (
        "fractional-price",
        _editing("models.toml", "credits = 6\n", "credits = 6.5\n"),
        "models.toml",
        f"{SEEDREAM}: credits: must be an integer, not 6.5",
    ),
    (
        "pack-without-price",
        _editing("site.toml", "yuan = 98\n", ""),
        "site.toml",
        "packs[1]: yuan: missing",
    ),
    (
        "two-packs-one-price",
        _editing("site.toml", "yuan = 98\n", "yuan = 30\n"),
        "site.toml",
        "packs[1]: yuan: 30 is the price of another pack",
    ),
    (
        "duplicate-id",
        _editing("models.toml", 'id = "flux-kontext-pro"', 'id = "seedream-4"'),
        "models.toml",
        "models[1] (id \"seedream-4\"): id: 'seedream-4' is the id of another model",
    ),
    (
        "quoted-date",
        _editing("models.toml", "retires_at = 2026-10-23", 'retires_at = "2026-10-23"'),
        "models.toml",
        'models[2] (id "gpt-image-1"): retires_at: must be a date (YYYY-MM-DD',
    ),
    (
        "impossible-date",
        _editing("site.toml", "updated = 2026-11-01\n", "updated = 2026-11-31\n"),
        "site.toml",
        "not valid TOML",
    ),
    (
        "not-utf-8",
        _not_utf8("presets.toml"),
        "presets.toml",
        "not UTF-8",
    ),
    (
        "no-prompt-at-all",
        _editing("models.toml", "max_prompt = 800\n", "max_prompt = 0\n"),
        "models.toml",
        'models[9] (id "wan-2-7"): max_prompt: must be a positive integer, not 0',
    ),
    (
        "video-without-length",
        _editing("models.toml", "seconds = 6\n", ""),
        "models.toml",
        'models[4] (id "hailuo-02"): seconds: missing',
    ),
    (
        "policy-without-effective-date",
        _editing(
            "site.toml",
            "updated = 2026-11-01\neffective = 2026-11-01\n",
            "updated = 2026-11-01\n",
        ),
        "site.toml",
        "documents.refund: effective: missing",
    ),
    (
        "unknown-document",
        _editing("site.toml", "[documents.api_docs]", "[documents.blog]"),
        "site.toml",
        "documents.blog: unknown document",
    ),
]


def _start(
    command: str, directory: Path, tmp_path: Path
) -> subprocess.CompletedProcess[str]:
    """Run the real command line with the operator's directory."""
    return subprocess.run(
        [sys.executable, "-m", "service", command],
        cwd=tmp_path,
        env=studio_environ(
            STUDIO_CONTENT_DIR=str(directory),
            STUDIO_REDIS_URL="redis://127.0.0.1:1/0",
            STUDIO_SECRET_KEY=TEST_SECRET,
            STUDIO_DATA_DIR=str(tmp_path / "data"),
        ),
        capture_output=True,
        text=True,
        timeout=30,
    )


def _assert_refused(
    result: subprocess.CompletedProcess[str], file: Path, problem: str
) -> None:
    """Exit 2 and one line on stderr naming the file, the entry and the problem."""
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"studio: configuration error: {file}: "), line
    assert problem in line, line


@pytest.mark.parametrize(
    ("breaker", "name", "problem"),
    [case[1:] for case in BAD_CASES],
    ids=[case[0] for case in BAD_CASES],
)
def test_serve_refuses_a_bad_content_directory_with_one_line(
    tmp_path: Path, breaker: Breaker, name: str, problem: str
) -> None:
    """Each fault stops `serve` before it listens: exit 2, file, entry, problem."""
    directory = own_copy(tmp_path)
    breaker(directory)
    _assert_refused(_start("serve", directory, tmp_path), directory / name, problem)


@pytest.mark.parametrize("command", ["worker", "dev"])
def test_the_worker_and_dev_refuse_it_the_same_way(
    tmp_path: Path, command: str
) -> None:
    """Workers and `make run` read the same directory and stop on the same line."""
    directory = own_copy(tmp_path)
    edit(directory / "models.toml", 'upstream = "replicate"', 'upstream = "azure"')
    result = _start(command, directory, tmp_path)
    _assert_refused(result, directory / "models.toml", "upstream: 'azure' is not")
    assert not (tmp_path / "data").exists(), "dev started nothing"


def test_a_content_directory_that_is_not_there_is_a_bad_setting(
    tmp_path: Path,
) -> None:
    """STUDIO_CONTENT_DIR naming no directory is refused like any setting."""
    result = _start("serve", tmp_path / "nowhere", tmp_path)
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert line == (
        "studio: configuration error: STUDIO_CONTENT_DIR:"
        f" {tmp_path / 'nowhere'} is not a directory"
    )


def test_a_pack_without_its_bonus_is_named_by_its_place(tmp_path: Path) -> None:
    """The entry is the pack's place in site.toml: a pack has no other name."""
    directory = own_copy(tmp_path)
    site = directory / "site.toml"
    site.write_text(site.read_text() + "\n[[packs]]\nyuan = 1\ncredits = 10\n")
    with pytest.raises(ContentError, match=r"packs\[4\]: bonus: missing$"):
        load_content(directory)
