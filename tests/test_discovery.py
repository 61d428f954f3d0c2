"""Crawler and machine files, checked with the parsers their consumers use."""

from __future__ import annotations

import json
import re
from pathlib import Path
from urllib.parse import urlsplit
from urllib.robotparser import RobotFileParser

import pytest
from llms_txt import parse_llms_file
from lxml import etree
from openapi_spec_validator import OpenAPIV31SpecValidator
from protego import Protego
from usp.tree import sitemap_from_str

from service.api.errors import FALLBACK
from service.keys import SETTINGS
from service.web.documents import CONTENT_SIGNAL
from service.web.routes import PUBLIC_ROUTES

from .conftest import Client

SCHEMAS = Path(__file__).parent / "schemas"
# Section 4 of the specification, copied by hand: the contract the router must match.
SPEC_PATHS = {
    "/healthz", "/", "/en", "/terms", "/privacy", "/refund", "/api-docs", "/robots.txt",
    "/sitemap.xml", "/llms.txt", "/openapi.json", "/.well-known/api-catalog",
    "/auth.md",
}  # fmt: skip
DOCUMENT_PATHS = ["/", "/en", "/terms", "/privacy", "/refund", "/api-docs"]
BOTS = ["*", "GPTBot", "ClaudeBot", "Googlebot", "PerplexityBot"]


async def test_robots_gives_the_same_verdicts_in_protego_and_urllib(
    client: Client,
) -> None:
    """Documents allowed, /api/ disallowed, one absolute sitemap, in both parsers."""
    base = client.app[SETTINGS].base_url
    response = await client.get("/robots.txt")
    assert response.headers["Content-Type"] == "text/plain; charset=utf-8"
    text = await response.text()
    protego = Protego.parse(text)
    stdlib = RobotFileParser()
    stdlib.parse(text.splitlines())
    for bot in BOTS:
        for path in [*DOCUMENT_PATHS, "/llms.txt", "/openapi.json"]:
            assert protego.can_fetch(base + path, bot)
            assert stdlib.can_fetch(bot, base + path)
        for path in ("/api/", "/api/square", "/api/auth/code"):
            assert not protego.can_fetch(base + path, bot)
            assert not stdlib.can_fetch(bot, base + path)
    assert list(protego.sitemaps) == [f"{base}/sitemap.xml"]
    assert stdlib.site_maps() == [f"{base}/sitemap.xml"]


async def test_robots_declares_the_content_signal_inside_the_group(
    client: Client,
) -> None:
    """The group is User-agent, Content-Signal, Disallow, Allow with no blank line."""
    text = await (await client.get("/robots.txt")).text()
    assert (
        "User-agent: *\nContent-Signal: search=yes, ai-input=yes, ai-train=no\n"
        "Disallow: /api/\nAllow: /\n" in text
    )
    signals = re.findall(r"^Content-Signal: (.+)$", text, re.MULTILINE)
    assert signals == [CONTENT_SIGNAL]
    pairs = dict(item.split("=") for item in signals[0].split(", "))
    assert pairs == {"search": "yes", "ai-input": "yes", "ai-train": "no"}
    assert "ARTICLE 4 OF THE EUROPEAN UNION DIRECTIVE 2019/790" in text


async def test_sitemap_is_valid_against_the_xsd_with_hreflang(client: Client) -> None:
    """The sitemap validates and lists the six documents with real dates."""
    base = client.app[SETTINGS].base_url
    response = await client.get("/sitemap.xml")
    assert response.headers["Content-Type"] == "application/xml; charset=utf-8"
    body = await response.read()
    schema = etree.XMLSchema(etree.parse(str(SCHEMAS / "sitemap-hreflang.xsd")))
    document = etree.fromstring(body)
    schema.assertValid(document)
    ns = {"s": "http://www.sitemaps.org/schemas/sitemap/0.9"}
    locs = [loc.text or "" for loc in document.findall("s:url/s:loc", ns)]
    assert sorted(locs) == sorted(base + path for path in DOCUMENT_PATHS)
    lastmods = [node.text or "" for node in document.findall("s:url/s:lastmod", ns)]
    assert all(re.fullmatch(r"\d{4}-\d{2}-\d{2}", value) for value in lastmods)


async def test_sitemap_hreflang_cluster_is_symmetric_for_crawlers(
    client: Client,
) -> None:
    """A crawler's parser reads zh-Hans, en and x-default on both homes, self too."""
    base = client.app[SETTINGS].base_url
    text = await (await client.get("/sitemap.xml")).text()
    pages = {page.url: page for page in sitemap_from_str(text).all_pages()}
    expected = {
        ("zh-Hans", f"{base}/"),
        ("en", f"{base}/en"),
        ("x-default", f"{base}/"),
    }
    for url in (f"{base}/", f"{base}/en"):
        assert set(pages[url].alternates or []) == expected
    assert not pages[f"{base}/terms"].alternates


async def test_llms_txt_parses_and_every_link_resolves_here(client: Client) -> None:
    """parse_llms_file reads it; each link is absolute and answers 200 on our router."""
    base = client.app[SETTINGS].base_url
    response = await client.get("/llms.txt")
    assert response.headers["Content-Type"] == "text/plain; charset=utf-8"
    parsed = parse_llms_file(await response.text())
    assert parsed.title
    assert parsed.summary
    assert parsed.info
    assert "credits" in parsed.info
    assert "API keys" in parsed.info
    assert {"Docs", "Models", "Policies", "Machine-readable", "Optional"} <= set(
        parsed.sections
    )
    links = [link for section in parsed.sections.values() for link in section]
    assert links
    for link in links:
        assert link["url"].startswith(base + "/"), link
        answer = await client.get(urlsplit(link["url"]).path)
        assert answer.status == 200, link


async def test_openapi_is_valid_31_and_lists_exactly_the_routed_public_paths(
    client: Client,
) -> None:
    """Spec, router and OpenAPI describe one set of thirteen endpoints."""
    response = await client.get("/openapi.json")
    assert response.headers["Content-Type"] == "application/json"
    spec = await response.json()
    OpenAPIV31SpecValidator(spec).validate()
    assert spec["openapi"].startswith("3.1")
    # Everything the root app routes, except the internal /api, the media and
    # work pages (CONTRACT §6, outside the public contract), the payment
    # providers' notices (§8) and the fallback.
    routed = {
        resource.canonical
        for resource in client.app.router.resources()
        if not resource.canonical.startswith(
            ("/api/", "/media/", "/square/", "/studio", "/static/", "/webhooks/")
        )
        and resource.name != FALLBACK
    }
    assert set(spec["paths"]) == routed == SPEC_PATHS == {r.path for r in PUBLIC_ROUTES}
    for path, item in spec["paths"].items():
        assert set(item) == {"get"}, path
        assert item["get"]["security"] == []
    assert spec["servers"] == [{"url": client.app[SETTINGS].base_url}]


async def test_openapi_declares_both_document_types_and_required_headers(
    client: Client,
) -> None:
    """Documents offer text/html and text/markdown under one 200 with Vary and Link."""
    spec = await (await client.get("/openapi.json")).json()
    for path in DOCUMENT_PATHS:
        ok = spec["paths"][path]["get"]["responses"]["200"]
        assert set(ok["content"]) == {"text/html", "text/markdown"}
        assert ok["headers"]["Vary"]["required"] is True
        assert ok["headers"]["Link"]["required"] is True
    health = spec["paths"]["/healthz"]["get"]["responses"]["200"]
    schema = health["content"]["application/json"]["schema"]
    assert schema["properties"]["status"]["enum"] == ["ok"]


@pytest.mark.parametrize("method", ["GET", "HEAD"])
async def test_api_catalog_is_an_rfc9727_linkset(client: Client, method: str) -> None:
    """GET and HEAD carry the profiled type and the api-catalog Link."""
    base = client.app[SETTINGS].base_url
    response = await client.request(method, "/.well-known/api-catalog")
    assert response.status == 200
    assert response.headers["Content-Type"] == (
        'application/linkset+json; profile="https://www.rfc-editor.org/info/rfc9727"'
    )
    assert (
        response.headers["Link"]
        == f'<{base}/.well-known/api-catalog>; rel="api-catalog"'
    )
    if method == "HEAD":
        return
    linkset = json.loads(await response.read())["linkset"]
    assert isinstance(linkset, list)
    assert linkset
    relations: dict[str, list[str]] = {}
    for context in linkset:
        assert context["anchor"].startswith(base)
        for relation, targets in context.items():
            if relation == "anchor":
                continue
            assert isinstance(targets, list)
            assert targets
            assert all("href" in target for target in targets)
            relations.setdefault(relation, []).extend(t["href"] for t in targets)
    assert f"{base}/openapi.json" in relations["service-desc"]
    assert f"{base}/api-docs" in relations["service-doc"]
    assert {f"{base}/auth.md", f"{base}/llms.txt"} <= set(relations["service-meta"])
    assert relations["status"] == [f"{base}/healthz"]


async def test_auth_md_states_the_human_only_stance(client: Client) -> None:
    """auth.md: H1 names it; cookie only, no keys or tokens, 401 NO_SESSION, contact."""
    response = await client.get("/auth.md")
    assert response.headers["Content-Type"] == "text/markdown; charset=utf-8"
    text = await response.text()
    assert text.startswith("# auth.md\n")
    for phrase in (
        "## Audience", "## Registration", "## Credentials", "studio_session",
        "HttpOnly", "SameSite=Lax", "Secure", "no API keys", "no bearer tokens",
        "`Authorization` request header is never read", "No long-lived credential",
        "/api/auth/code", "/api/auth/verify", "Do not probe", "NO_SESSION",
        "mailto:",
    ):  # fmt: skip
        assert phrase in text, phrase


async def test_healthz_answers_ok_and_is_never_cached(client: Client) -> None:
    """The liveness answer is exactly {"status": "ok"} with no-store."""
    response = await client.get("/healthz")
    assert response.status == 200
    assert response.headers["Content-Type"] == "application/json"
    assert response.headers["Cache-Control"] == "no-store"
    assert await response.json() == {"status": "ok"}
