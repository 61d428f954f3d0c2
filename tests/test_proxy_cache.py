"""deploy/nginx.conf caches the public documents per negotiated representation.

The real nginx in front of the real `serve` (or, where a test moves the clock,
the real app from the factory on a port): each Accept of the negotiation
table gets the app's own bytes from the cache, a header whose q-values the
proxy cannot weigh bypasses it, and a document rendered again at a retirement
midnight is served within the cache's freshness lifetime.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import http.client
import re
import time
from collections.abc import Iterator, Mapping
from typing import Final

import pytest
from aiohttp import ClientSession, hdrs
from hypothesis import HealthCheck, given, settings, strategies as st
from multidict import CIMultiDict
from pytest_aiohttp import AiohttpServer

from service.app import create_app
from service.clock import midnight, utc_now
from service.store.embedded import RedisServer
from service.web.negotiation import accepts_gzip, prefers_markdown

from .conftest import TEST_SECRET, SettingsFactory
from .nginx import CONFIG, NGINX, Proxy, nginx_in_front
from .processes import running
from .test_negotiation import CHROME, TABLE
from .test_retirement import NAME, RETIRES, retiring

pytestmark = pytest.mark.skipif(
    NGINX is None, reason="nginx is not installed (apt-get install nginx)"
)
# How long an entry is fresh, as deploy/nginx.conf says it.
_FRESH = re.search(r"proxy_cache_valid 200 (\d+)s;", CONFIG.read_text())
assert _FRESH is not None, "deploy/nginx.conf lost its documents' lifetime"
MAX_AGE: Final = int(_FRESH.group(1))
# nginx keeps time in whole seconds: an entry can live up to one more.
GRANULARITY: Final = 1.0
# Test-only: what the proxy's maps decided for a request ("" = undecided).
DECISIONS: Final = """
        location = /__negotiated {
            return 200 "$document_accept $document_coding";
        }
"""
CRAWLER_FILES: Final = [
    "/robots.txt",
    "/sitemap.xml",
    "/llms.txt",
    "/openapi.json",
    "/.well-known/api-catalog",
    "/auth.md",
]
DOCUMENTS: Final = ["/", "/en", "/terms", "/privacy", "/refund", "/api-docs"]
Headers = Mapping[str, str]


@pytest.fixture(scope="module")
def serve(redis_server: RedisServer) -> Iterator[str]:
    """Start the real `serve`, trusting the proxy; yield its host:port."""
    variables = {
        "STUDIO_REDIS_URL": redis_server.url,
        "STUDIO_SECRET_KEY": TEST_SECRET,
        "STUDIO_TRUSTED_PROXIES": "127.0.0.1/32",
    }
    with running("serve", variables) as (base, _):
        yield base.removeprefix("http://")


@pytest.fixture
def proxy(serve: str) -> Iterator[Proxy]:
    """Start nginx with deploy/nginx.conf, and an empty cache, before `serve`."""
    with nginx_in_front(serve, locations=DECISIONS) as running_proxy:
        yield running_proxy


def _get(port: int, path: str, headers: Headers) -> tuple[int, Headers, bytes]:
    """GET with exactly these headers (bytes as UTF-8), nothing added."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.putrequest("GET", path, skip_host=True, skip_accept_encoding=True)
        connection.putheader("Host", "studio.test")
        for name, value in headers.items():
            connection.putheader(name, value.encode())
        connection.endheaders()
        response = connection.getresponse()
        return response.status, CIMultiDict(response.getheaders()), response.read()
    finally:
        connection.close()


def _request_headers(accept: str | None, coding: str | None) -> dict[str, str]:
    headers = {}
    if accept is not None:
        headers["Accept"] = accept
    if coding is not None:
        headers["Accept-Encoding"] = coding
    return headers


def _decided(proxy: Proxy, headers: Headers) -> bool:
    status, _, body = _get(proxy.port, "/__negotiated", headers)
    assert status == 200
    return "" not in body.decode().split(" ")


_SAME: Final = (
    hdrs.CONTENT_TYPE,
    hdrs.CONTENT_ENCODING,
    hdrs.ETAG,
    hdrs.VARY,
    hdrs.LINK,
    hdrs.CACHE_CONTROL,
)


@pytest.mark.parametrize("coding", [None, "gzip, deflate, br, zstd"])
def test_each_accept_of_the_negotiation_table_gets_the_apps_bytes_from_the_cache(
    proxy: Proxy, serve: str, coding: str | None
) -> None:
    """The second request is a HIT with the app's bytes, or a BYPASS if undecided."""
    port = int(serve.rsplit(":", 1)[1])
    hits = set()
    for accept, markdown in TABLE:
        headers = _request_headers(accept, coding)
        status, direct_headers, direct = _get(port, "/en", headers)
        assert status == 200
        _get(proxy.port, "/en", headers)
        status, cached_headers, cached = _get(proxy.port, "/en", headers)
        assert status == 200
        assert cached == direct, accept
        for name in _SAME:
            assert cached_headers.get(name) == direct_headers.get(name), (accept, name)
        assert cached_headers["Content-Type"].startswith(
            "text/markdown" if markdown else "text/html"
        )
        expected = "HIT" if _decided(proxy, headers) else "BYPASS"
        assert cached_headers["X-Cache-Status"] == expected, accept
        if expected == "HIT":
            hits.add(accept)
    # The contract's named cases are all answered by nginx itself.
    named = {None, "*/*", "text/*", CHROME, "application/json", "garbage"}
    named |= {"text/markdown", "text/markdown, text/html, */*"}
    named |= {"text/html, text/markdown", "text/html, text/markdown;q=0.5"}
    named |= {"text/markdown, text/html;q=0.9, */*;q=0.1"}
    assert named <= hits


def test_a_second_request_for_en_is_served_by_nginx_in_its_representation(
    proxy: Proxy, serve: str
) -> None:
    """Accept: text/markdown gets the Markdown bytes, */* the HTML, both HITs."""
    port = int(serve.rsplit(":", 1)[1])
    for accept, content_type in (
        ("text/markdown", "text/markdown; charset=utf-8"),
        ("*/*", "text/html; charset=utf-8"),
    ):
        _, _, app_bytes = _get(port, "/en", {"Accept": accept})
        _, first, _ = _get(proxy.port, "/en", {"Accept": accept})
        assert first["X-Cache-Status"] == "MISS"
        _, second, body = _get(proxy.port, "/en", {"Accept": accept})
        assert second["X-Cache-Status"] == "HIT"
        assert second["Content-Type"] == content_type
        assert second["Vary"] == "Accept, Accept-Encoding"
        assert body == app_bytes
    markdown = _get(proxy.port, "/en", {"Accept": "text/markdown"})[2]
    assert markdown.startswith(b"---\n")
    html = _get(proxy.port, "/en", {"Accept": "*/*"})[2]
    assert html.lower().startswith(b"<!doctype html>")


def test_every_public_document_and_crawler_file_is_cached(proxy: Proxy) -> None:
    """Twice each: the second one is nginx's, with the same bytes; /healthz never."""
    for path in DOCUMENTS + CRAWLER_FILES:
        _, first, body = _get(proxy.port, path, {})
        _, second, again = _get(proxy.port, path, {})
        assert (first["X-Cache-Status"], second["X-Cache-Status"]) == ("MISS", "HIT")
        assert again == body, path
    _, health, _ = _get(proxy.port, "/healthz", {})
    assert "X-Cache-Status" not in health


def test_a_cached_etag_is_answered_304_by_nginx(proxy: Proxy) -> None:
    """If-None-Match with the entry's ETag: 304 without a body, from the cache."""
    headers = {"Accept": "text/markdown", "Accept-Encoding": "gzip"}
    _, first, _ = _get(proxy.port, "/terms", headers)
    status, again, body = _get(
        proxy.port, "/terms", {**headers, "If-None-Match": first["ETag"]}
    )
    assert (status, body, again["X-Cache-Status"]) == (304, b"", "HIT")
    assert again["ETag"] == first["ETag"]
    status, _, body = _get(proxy.port, "/terms", {**headers, "If-None-Match": '"x"'})
    assert status == 200
    assert body


def test_an_entry_past_its_lifetime_is_revalidated_with_its_etag(
    proxy: Proxy,
) -> None:
    """After MAX_AGE the app is asked again (conditionally) and the entry refreshed."""
    _get(proxy.port, "/privacy", {})
    time.sleep(MAX_AGE + GRANULARITY + 0.1)
    _, headers, _ = _get(proxy.port, "/privacy", {})
    assert headers["X-Cache-Status"] == "REVALIDATED"
    _, headers, _ = _get(proxy.port, "/privacy", {})
    assert headers["X-Cache-Status"] == "HIT"


_media = st.sampled_from(
    [
        *("text/markdown", "text/html", "text/*", "*/*", "application/json"),
        *("TEXT/MARKDOWN", "Text/Html", "text/markdownx", "markdown", ""),
    ]
)
_coding = st.sampled_from(
    ["gzip", "x-gzip", "*", "br", "GZIP", "identity", "gzipx", "deflate", ""]
)
_parameter = st.sampled_from(
    [
        *("", ";q=0", ";q=1", ";q=0.5", ";Q=0.9", ";q=1.000", ";q=2", ";q="),
        *(" ; q=0.3", ";charset=utf-8", ";level=1;q=0.4", ";q=.5", ";q=0.²"),
    ]
)
_space = st.sampled_from(["", " ", "\t", "  "])


def _header(items: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    item = st.builds(lambda *parts: "".join(parts), _space, items, _parameter, _space)
    # Any text but NUL, CR and LF (nginx refuses those in a header).
    text = st.text(
        st.characters(blacklist_characters="\x00\r\n", blacklist_categories=["Cs"]),
        max_size=40,
    )
    return st.one_of(st.lists(item, max_size=5).map(",".join), text)


@pytest.fixture(scope="module")
def decider(serve: str) -> Iterator[Proxy]:
    """One proxy for all the examples of the property test."""
    with nginx_in_front(serve, locations=DECISIONS) as running_proxy:
        yield running_proxy


@given(accept=_header(_media), coding=_header(_coding))
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_the_proxy_decides_as_the_app_does_or_leaves_it_to_the_app(
    decider: Proxy, accept: str, coding: str
) -> None:
    """nginx's maps agree with service/web/negotiation.py wherever they decide."""
    _, _, body = _get(
        decider.port, "/__negotiated", {"Accept": accept, "Accept-Encoding": coding}
    )
    representation, content_coding = body.decode().split(" ")
    if representation:
        assert representation == ("markdown" if prefers_markdown(accept) else "html")
    if content_coding:
        assert content_coding == ("gzip" if accepts_gzip(coding) else "identity")
    # Without parameters, in printable ASCII, every q is 1: always decided.
    if re.fullmatch(r"[\x20-\x3a\x3c-\x7e\t]*", accept + coding):
        assert representation
        assert content_coding


async def test_a_document_rendered_again_at_a_retirement_is_fresh_within_max_age(
    aiohttp_server: AiohttpServer, make_settings: SettingsFactory
) -> None:
    """Cached before midnight; MAX_AGE after it, nginx serves the new edition."""
    offset = midnight(RETIRES) - dt.timedelta(seconds=5) - utc_now()

    def clock() -> dt.datetime:
        return utc_now() + offset

    app = create_app(make_settings(), content=retiring(RETIRES), clock=clock)
    server = await aiohttp_server(app)
    cases = [{}, {"Accept": "text/markdown"}, {"Accept-Encoding": "gzip"}]
    with nginx_in_front(f"127.0.0.1:{server.port}") as proxy:
        async with ClientSession(
            f"http://127.0.0.1:{proxy.port}",
            auto_decompress=True,
            skip_auto_headers=[hdrs.ACCEPT, hdrs.ACCEPT_ENCODING],
        ) as session:

            async def fetch(headers: Headers) -> tuple[str, str]:
                async with session.get("/en", headers=headers) as response:
                    assert response.status == 200
                    return response.headers["X-Cache-Status"], await response.text()

            for headers in cases:
                await fetch(headers)
                status, text = await fetch(headers)
                assert status == "HIT"
                assert NAME in text
            assert clock() < midnight(RETIRES), "the test took too long to start"
            fresh_by = midnight(RETIRES) + dt.timedelta(seconds=MAX_AGE + GRANULARITY)
            await asyncio.sleep((fresh_by - clock()).total_seconds() + 0.1)
            for headers in cases:
                status, text = await fetch(headers)
                assert NAME not in text, headers
                assert status in {"EXPIRED", "MISS"}
                status, text = await fetch(headers)
                assert status == "HIT"
                assert NAME not in text


async def test_while_the_app_is_down_the_last_copy_is_served_stale(
    aiohttp_server: AiohttpServer, make_settings: SettingsFactory
) -> None:
    """Past its lifetime with no app to revalidate with: the cached bytes, STALE."""
    server = await aiohttp_server(create_app(make_settings()))
    with nginx_in_front(f"127.0.0.1:{server.port}") as proxy:
        async with ClientSession(f"http://127.0.0.1:{proxy.port}") as session:
            async with session.get("/en") as response:
                cached = await response.read()
            await server.close()
            await asyncio.sleep(MAX_AGE + GRANULARITY + 0.1)
            async with session.get("/en") as response:
                assert response.status == 200
                assert response.headers["X-Cache-Status"] == "STALE"
                assert await response.read() == cached
            async with session.get("/terms") as response:  # never cached
                assert response.status == 502
