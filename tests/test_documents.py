"""The six negotiated documents: representations, headers, validators, content."""

from __future__ import annotations

import datetime as dt
import gzip
import re
import tomllib

import pytest
from bs4 import BeautifulSoup, Tag

from service.content import CONTENT_DIR, load_content
from service.keys import SETTINGS
from service.web.documents import CONTENT_SIGNAL, estimate_tokens

from .conftest import Client

DOCUMENTS = ["/", "/en", "/terms", "/privacy", "/refund", "/api-docs"]
MARKDOWN = {"Accept": "text/markdown"}
IDENTITY = {"Accept-Encoding": "identity"}
LANGS = {"/": "zh-Hans", "/en": "en", "/terms": "zh-Hans", "/privacy": "zh-Hans",
         "/refund": "zh-Hans", "/api-docs": "en"}  # fmt: skip


def _front_matter(markdown: str) -> dict[str, str]:
    match = re.match(r"---\n(.*?)\n---\n\n# ", markdown, re.DOTALL)
    assert match, "front matter, then a single H1"
    pairs = (line.split(": ", 1) for line in match.group(1).splitlines())
    return {key: value.strip('"') for key, value in pairs}


@pytest.mark.parametrize("path", DOCUMENTS)
async def test_default_accept_gets_html_with_every_contracted_header(
    client: Client, path: str
) -> None:
    """Without Markdown in Accept the answer is HTML with Vary, Link and signals."""
    for accept in (None, "*/*", "text/*", "application/json"):
        headers = {"Accept": accept} if accept else {}
        response = await client.get(path, headers=headers)
        assert response.status == 200
        assert response.headers["Content-Type"] == "text/html; charset=utf-8"
        assert "Accept" in [v.strip() for v in response.headers["Vary"].split(",")]
        assert response.headers["Content-Signal"] == CONTENT_SIGNAL
        alternate = f'<{client.app[SETTINGS].base_url}{path}>; rel="alternate"'
        assert f'{alternate}; type="text/markdown"' in response.headers["Link"]
        assert f'<html lang="{LANGS[path]}">' in await response.text()


@pytest.mark.parametrize("path", DOCUMENTS)
async def test_explicit_markdown_gets_markdown_with_front_matter(
    client: Client, path: str
) -> None:
    """Accept: text/markdown gets Markdown, its tokens header and both alternates."""
    response = await client.get(path, headers=MARKDOWN)
    body = await response.text()
    assert response.status == 200
    assert response.headers["Content-Type"] == "text/markdown; charset=utf-8"
    assert "Accept" in response.headers["Vary"]
    assert response.headers["Content-Signal"] == CONTENT_SIGNAL
    link = response.headers["Link"]
    assert 'rel="alternate"; type="text/markdown"' in link
    assert 'rel="alternate"; type="text/html"' in link
    front = _front_matter(body)
    assert set(front) == {"title", "description", "lang"}
    assert front["lang"] == LANGS[path]
    assert front["title"]
    assert front["description"]
    assert body.count("\n# ") == 1
    tokens = int(response.headers["x-markdown-tokens"])
    assert tokens == estimate_tokens(body) > 0


async def test_home_pages_link_the_machine_indexes(client: Client) -> None:
    """/ and /en name the api-catalog, service-desc and service-doc in Link."""
    for path in ("/", "/en"):
        for headers in ({}, MARKDOWN):
            link = (await client.get(path, headers=headers)).headers["Link"]
            assert '/.well-known/api-catalog>; rel="api-catalog"' in link
            assert '/openapi.json>; rel="service-desc"' in link
            assert '/api-docs>; rel="service-doc"' in link
    link = (await client.get("/terms")).headers["Link"]
    assert "api-catalog" not in link


@pytest.mark.parametrize("path", DOCUMENTS)
async def test_each_representation_has_its_own_strong_etag_and_304(
    client: Client, path: str
) -> None:
    """If-None-Match gets 304 only for the representation the request selects."""
    html = await client.get(path, headers=IDENTITY)
    markdown = await client.get(path, headers={**MARKDOWN, **IDENTITY})
    html_tag, md_tag = html.headers["ETag"], markdown.headers["ETag"]
    assert html_tag != md_tag
    assert not html_tag.startswith("W/")
    assert not md_tag.startswith("W/")

    again = await client.get(path, headers={**IDENTITY, "If-None-Match": html_tag})
    assert again.status == 304
    assert await again.read() == b""
    assert again.headers["ETag"] == html_tag
    assert "Accept" in again.headers["Vary"]
    assert "Link" in again.headers

    crossed = await client.get(path, headers={**IDENTITY, "If-None-Match": md_tag})
    assert crossed.status == 200
    md_again = await client.get(
        path, headers={**MARKDOWN, **IDENTITY, "If-None-Match": f'W/{md_tag}, "x"'}
    )
    assert md_again.status == 304

    # each content coding is a representation of its own (RFC 9110 §13.1.2)
    zipped = await client.get(path, headers={"Accept-Encoding": "gzip"})
    gz_tag = zipped.headers["ETag"]
    assert zipped.headers["Content-Encoding"] == "gzip"
    assert gz_tag not in (html_tag, md_tag)
    plain = await client.get(path, headers={**IDENTITY, "If-None-Match": gz_tag})
    assert plain.status == 200
    assert plain.headers["ETag"] == html_tag
    unzipped = await client.get(
        path, headers={"Accept-Encoding": "gzip", "If-None-Match": html_tag}
    )
    assert unzipped.status == 200
    both = await client.get(
        path,
        headers={"Accept-Encoding": "gzip", "If-None-Match": f"{html_tag}, {gz_tag}"},
    )
    assert both.status == 304
    assert both.headers["ETag"] == gz_tag


@pytest.mark.parametrize("path", DOCUMENTS)
@pytest.mark.parametrize("accept", [{}, MARKDOWN])
async def test_head_has_the_headers_of_get_and_no_body(
    client: Client, path: str, accept: dict[str, str]
) -> None:
    """HEAD answers like GET, without the body."""
    get = await client.get(path, headers={**accept, **IDENTITY})
    head = await client.head(path, headers={**accept, **IDENTITY})
    assert head.status == 200
    assert await head.read() == b""
    for name in (
        "Content-Type",
        "Vary",
        "Link",
        "ETag",
        "Content-Signal",
        "Content-Length",
    ):
        assert head.headers.get(name) == get.headers.get(name), name


async def test_gzip_variant_carries_the_same_bytes(client: Client) -> None:
    """A gzip-accepting client gets the same document compressed, with its own ETag."""
    plain = await client.get("/terms", headers=IDENTITY)
    zipped = await client.get(
        "/terms", headers={"Accept-Encoding": "gzip"}, auto_decompress=False
    )
    assert zipped.headers["Content-Encoding"] == "gzip"
    assert "Accept-Encoding" in zipped.headers["Vary"]
    assert gzip.decompress(await zipped.read()) == await plain.read()
    assert zipped.headers["ETag"] != plain.headers["ETag"]


def _normalise(text: str) -> str:
    text = re.sub(r"\\([\\`*_{}\[\]()#+\-.!|<>~])", r"\1", text)
    return re.sub(r"\s+", " ", text).strip()


def _html_facts(html: str) -> tuple[list[str], list[str]]:
    """List the texts and link targets of <main> a reader would need."""
    main = BeautifulSoup(html, "html.parser").find("main")
    assert isinstance(main, Tag)
    texts = [
        node.get_text(" ", strip=True)
        for node in main.find_all(["h1", "h2", "h3", "p", "li", "td", "th"])
    ]
    links = [str(a["href"]) for a in main.find_all("a", href=True)]
    return [text for text in texts if text], links


@pytest.mark.parametrize("path", DOCUMENTS)
async def test_markdown_keeps_every_heading_link_cell_and_paragraph(
    client: Client, path: str
) -> None:
    """Walk the HTML <main> and find each piece of it in the Markdown."""
    base = client.app[SETTINGS].base_url
    html = await (await client.get(path)).text()
    markdown = await (await client.get(path, headers=MARKDOWN)).text()
    # Reading order without markup: link targets, emphasis marks and spacing dropped.
    unlinked = (
        re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", markdown)
        .replace("**", "")
        .replace("`", "")
    )
    flat = re.sub(r"\s+", "", _normalise(unlinked))
    texts, links = _html_facts(html)
    assert texts
    assert links
    for text in texts:
        assert re.sub(r"\s+", "", text) in flat, text
    for href in links:
        absolute = href if re.match(r"[a-z]+:", href) else base + href
        assert f"]({absolute})" in markdown, href
    assert not re.search(r"<[a-zA-Z/][^>]*>", markdown.split("\n---\n", 1)[1])
    assert "class=" not in markdown
    assert "style=" not in markdown
    relative = re.findall(r"\]\((?!https?:|mailto:)", markdown)
    assert not relative


@pytest.mark.parametrize("path", ["/refund", "/", "/en"])
async def test_tables_stay_gfm_tables(client: Client, path: str) -> None:
    """Price and refund tables keep their rows as GFM pipe tables."""
    html = await (await client.get(path)).text()
    markdown = await (await client.get(path, headers=MARKDOWN)).text()
    rows = BeautifulSoup(html, "html.parser").select("main table tr")
    md_rows = [line for line in markdown.splitlines() if line.startswith("| ")]
    separators = [
        line for line in markdown.splitlines() if re.match(r"^\| -+ \|", line)
    ]
    assert len(md_rows) == len(rows) + len(separators)
    assert separators


async def test_home_pages_show_every_model_price_and_the_trial(client: Client) -> None:
    """The models on offer in content/models.toml and the trial reach both homes."""
    with (CONTENT_DIR / "models.toml").open("rb") as file:
        models = tomllib.load(file)["models"]
    today = dt.datetime.now(dt.UTC).date()
    offered = [
        m for m in models if not ("retires_at" in m and m["retires_at"] <= today)
    ]
    assert offered
    trial = str(client.app[SETTINGS].trial_credits)
    for path in ("/", "/en"):
        markdown = await (await client.get(path, headers=MARKDOWN)).text()
        for model in offered:
            assert model["name"] in _normalise(markdown)
            assert f"{model['credits']} " in markdown
        assert trial in markdown


def test_token_estimate_counts_chinese_characters_one_each() -> None:
    """CJK text counts about one token per character, other text one per four."""
    assert estimate_tokens("流光工坊") == 4
    assert estimate_tokens("abcdefgh") == 2
    assert estimate_tokens("流光abcd") == 3


def test_every_document_has_real_dates_from_content() -> None:
    """site.toml gives each public document a path, language and date."""
    content = load_content()
    assert sorted(meta.path for meta in content.documents.values()) == sorted(DOCUMENTS)
