"""Fuzz every internal route (/api/*, /webhooks/*) against the real app.

Schemathesis runs over tests/internal_openapi.yaml, signed in and anonymous;
hypothesis strategies add the hostile inputs of issue 23 (lone surrogates,
huge digit strings, broken multipart, content encodings we do not take). Every
answer must be below 500, every 4xx of ours JSON with an `error` string, and
the service log must hold no traceback. `make test` prints how many cases ran.
"""

from __future__ import annotations

import collections
import contextlib
import json
import re
import time
import zlib
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Final, TypeVar

import hypothesis
import pytest
import requests
import schemathesis
import yaml
from hypothesis import HealthCheck, Phase, example, given, strategies as st
from redis import Redis as SyncRedis

from service.app import create_app
from service.payments.keys import PROVIDERS
from service.payments.providers.wechatpay import WechatPayProvider
from service.settings import load_settings
from service.store.embedded import MailCatcher, RedisServer

from .conftest import GENEROUS_LIMITS, SUMMARY, TEST_SECRET
from .internal_fuzz import (
    Served,
    describe,
    error_body,
    error_of,
    serving,
    settings_variables,
)
from .ports import free_port

SPEC_PATH: Final = Path(__file__).with_name("internal_openapi.yaml")
SPEC: Final[dict[str, Any]] = yaml.safe_load(SPEC_PATH.read_text())
SAFE_METHODS: Final = frozenset({"GET", "HEAD", "OPTIONS"})
# Routes that end the session they are called with: each case gets its own.
SESSION_ENDING: Final = frozenset({"auth_logout", "auth_logout_all"})
# Cases per operation and caller, beyond the examples and the coverage phase.
MAX_EXAMPLES: Final = 20
# Cases per hostile-input test (each hits one field, parameter or route).
HOSTILE_EXAMPLES: Final = 6

CONFIG: Final = schemathesis.Config.from_dict(
    {
        "seed": 23,
        "request-timeout": 10,
        # /api/events streams: read its first event, then hang up.
        "max-stream-events": 1,
        "generation": {
            "mode": "all",
            "max-examples": MAX_EXAMPLES,
            "no-shrink": True,
            "deterministic": True,
            "database": "none",
            # The session cookie comes from signing in, not from the fuzzer.
            "with-security-parameters": False,
        },
        "phases": {
            "examples": {"enabled": True},
            "coverage": {"enabled": True},
            "fuzzing": {"enabled": True},
            "stateful": {"enabled": False},
        },
        "checks": {
            "enabled": False,
            "not_a_server_error": {"enabled": True},
            "response_schema_conformance": {"enabled": True},
            "content_type_conformance": {"enabled": True},
        },
    }
)
SCHEMA: Final = schemathesis.openapi.from_dict(SPEC, config=CONFIG)
HOSTILE: Final = hypothesis.settings(
    max_examples=HOSTILE_EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    phases=(Phase.explicit, Phase.generate),
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
# Cases run, by caller, and the operations they covered.
TALLY: Final[collections.Counter[str]] = collections.Counter()
COVERED: Final[dict[str, set[str]]] = collections.defaultdict(set)
R = TypeVar("R")
# Cases asked again after a 503 UNAVAILABLE (see `answered`).
ASKED_AGAIN: Final[collections.Counter[str]] = collections.Counter()
# How long a case waits before it is asked again.
AGAIN_SECONDS: Final = 0.5


def answered(who: str, send: Callable[[], R], status: Callable[[R], str]) -> R:
    """Send once, and once more after a 503 UNAVAILABLE: whatever the input.

    A route that fails closed (sign-in's limiter, CONTRACT §4) answers 503
    UNAVAILABLE with Retry-After when Redis has not answered within its 100 ms,
    as it may on a machine as loaded as the soak's (once in three runs of 4,100
    cases there). That is the promised answer, not the input's fault, so the
    case is asked again once, as a client honouring Retry-After would; a second
    503 fails it. A 503 from a store error also logs "store unavailable", which
    fails the case through the log either way. The summary counts the cases
    asked again. `status` reads an answer as "503 UNAVAILABLE" or otherwise.
    """
    response = send()
    if status(response) == UNAVAILABLE:
        ASKED_AGAIN[who] += 1
        time.sleep(AGAIN_SECONDS)
        response = send()
    return response


def status_of(code: int, headers: Mapping[str, str], content: bytes) -> str:
    """An answer as "<status> <error code>", the error code when it has one."""
    lowered = {name.lower(): value for name, value in headers.items()}
    body = error_of(lowered.get("content-type", ""), content)
    retry = " retry" if "retry-after" in lowered else ""
    return f"{code} {body['error'] if body else ''}{retry}"


UNAVAILABLE: Final = "503 UNAVAILABLE retry"


def operations() -> Iterator[tuple[str, str, dict[str, Any]]]:
    """Yield (method, path, operation) for every operation of the description."""
    for path, item in SPEC["paths"].items():
        for method, operation in item.items():
            yield method.upper(), path, operation


def operation_by_id(operation_id: str) -> tuple[str, str, dict[str, Any]]:
    """Find one operation of the description by its operationId."""
    for method, path, operation in operations():
        if operation["operationId"] == operation_id:
            return method, path, operation
    raise KeyError(operation_id)


@pytest.fixture(scope="module")
def served(
    redis_server: RedisServer,
    mail_server: MailCatcher,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Served]:
    """The real app with the demo upstream and the fake provider, on a free port."""
    with SyncRedis.from_url(redis_server.url) as redis:
        redis.flushdb()
    port = free_port()
    settings = load_settings(
        {
            "STUDIO_REDIS_URL": redis_server.url,
            "STUDIO_SECRET_KEY": TEST_SECRET,
            "STUDIO_SMTP_HOST": mail_server.host,
            "STUDIO_SMTP_PORT": str(mail_server.port),
            **GENEROUS_LIMITS,
            **settings_variables(tmp_path_factory.mktemp("fuzz"), port),
        }
    )
    with serving(settings, port, mail_server) as app:
        yield app
    faults = app.log.faults()
    assert not faults, "the service logged faults:\n" + "\n".join(faults)


@pytest.fixture(scope="module", autouse=True)
def tally(request: pytest.FixtureRequest) -> Iterator[None]:
    """Tell the terminal summary how many cases ran over how many operations."""
    yield
    total = sum(TALLY.values())
    if not total:
        return
    fuzzed = set().union(*COVERED.values())
    line = (
        f"internal fuzz: {total} cases over {len(fuzzed)} operations "
        f"(schemathesis anonymous {TALLY['anonymous']}, "
        f"signed in {TALLY['signed-in']}; hostile inputs {TALLY['hostile']}; "
        f"asked again after a 503 UNAVAILABLE: {sum(ASKED_AGAIN.values())})"
    )
    request.config.stash.setdefault(SUMMARY, []).append(line)


def assert_clean(response: requests.Response, faults: list[str]) -> None:
    """Below 500; a 4xx is JSON with an `error` string; nothing broke in the log."""
    assert response.status_code < 500, describe(response)
    if response.status_code >= 400:
        assert error_body(response) is not None, describe(response)
    assert not faults, describe(response) + "\nlogged:\n" + "\n".join(faults)


def _call(
    served: Served, who: str, operation_id: str, path: str, **kwargs: Any
) -> tuple[requests.Response, list[str]]:
    """Send one hostile request; return the answer and what the service logged."""
    method, template, _ = operation_by_id(operation_id)
    session = served.session(who)
    response = answered(
        "hostile",
        lambda: session.request(method, served.base_url + path, timeout=10, **kwargs),
        lambda r: status_of(r.status_code, r.headers, r.content),
    )
    TALLY["hostile"] += 1
    COVERED["hostile"].add(f"{method} {template}")
    return response, served.log.faults()


def test_the_description_names_every_internal_route_and_no_other() -> None:
    """A route added to the router without a description here fails the suite."""
    settings = load_settings(
        {
            "STUDIO_REDIS_URL": "redis://127.0.0.1:1",
            "STUDIO_SECRET_KEY": TEST_SECRET,
            "STUDIO_PAYMENTS_FAKE": "1",
        }
    )
    app = create_app(settings)
    routed: set[tuple[str, str]] = set()
    heads: set[str] = set()
    for route in app.router.routes():
        path = route.resource.canonical if route.resource else ""
        if not path.startswith(("/api/", "/webhooks/")):
            continue
        if route.method == "HEAD":
            heads.add(path)
        else:
            routed.add((route.method, path))
    described = {(method, path) for method, path, _ in operations()}
    assert described == routed
    # HEAD is left out of the description: only GET routes answer it.
    assert heads <= {path for method, path in routed if method == "GET"}
    ids = [operation["operationId"] for _, _, operation in operations()]
    assert len(ids) == len(set(ids))


def aim_at_known(case: schemathesis.Case[Any], served: Served) -> None:
    """Swap about half the generated path parameters for ids that exist.

    Random ids only ever meet 404; a real work, generation, order or export
    takes the case through the rest of its handler. The choice hangs on the
    generated value, so a run repeats exactly.
    """
    operation_id = case.operation.definition.raw["operationId"]
    parameters = case.path_parameters or {}
    for name, value in parameters.items():
        known = served.known.get(f"{operation_id}:{name}") or served.known.get(name)
        digest = zlib.crc32(str(value).encode())
        if known and digest % 2:
            parameters[name] = known[digest // 2 % len(known)]


@pytest.mark.parametrize("who", ["anonymous", "signed-in"])
@SCHEMA.parametrize()
def test_no_internal_route_fails_under_schemathesis(
    case: schemathesis.Case[Any], who: str, served: Served
) -> None:
    """Every case: no 5xx, answers as described, 4xx as JSON errors, a clean log."""
    operation = case.operation.definition.raw
    aim_at_known(case, served)
    headers = {} if case.method in SAFE_METHODS else served.same_origin()
    with contextlib.ExitStack() as stack:
        if who == "signed-in" and operation["operationId"] in SESSION_ENDING:
            session = stack.enter_context(served.sign_in())
        else:
            session = served.session(who)
        response = answered(
            who,
            lambda: case.call(
                base_url=served.base_url, session=session, headers=headers
            ),
            lambda r: status_of(
                r.status_code, {k: v[0] for k, v in r.headers.items()}, r.content
            ),
        )
    faults = served.log.faults()  # before any check can stop the case
    TALLY[who] += 1
    COVERED[who].add(case.operation.label)
    case.validate_response(response, headers=headers)
    curl = case.as_curl_command(headers=headers)
    if response.status_code >= 400:
        content_type = {k.lower(): v for k, v in response.headers.items()}.get(
            "content-type", [""]
        )
        error = error_of(content_type[0], response.content)
        assert error is not None, (
            f"{curl}\n-> {response.status_code} {response.content!r:.300}"
        )
    assert not faults, curl + "\nlogged:\n" + "\n".join(faults)


def test_every_operation_was_fuzzed_signed_in_and_anonymous() -> None:
    """The schemathesis run reached each operation of the description both ways."""
    if not TALLY:
        pytest.skip("the schemathesis run was not selected")
    labels = {f"{method} {path}" for method, path, _ in operations()}
    assert COVERED["anonymous"] == labels
    assert COVERED["signed-in"] == labels


# -- hostile inputs ------------------------------------------------------------


def _json_operations() -> list[str]:
    return [
        operation["operationId"]
        for _, _, operation in operations()
        if "application/json" in operation.get("requestBody", {}).get("content", {})
    ]


def _string_fields(
    value: Any, at: tuple[str | int, ...] = ()
) -> Iterator[tuple[str | int, ...]]:
    """Yield the path to every string in a JSON example."""
    if isinstance(value, str):
        yield at
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _string_fields(item, (*at, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _string_fields(item, (*at, index))


def _example(operation_id: str) -> Any:
    _, _, operation = operation_by_id(operation_id)
    return operation["requestBody"]["content"]["application/json"]["example"]


STRING_FIELDS: Final = [
    pytest.param(operation_id, at, id=f"{operation_id}:{'.'.join(map(str, at))}")
    for operation_id in _json_operations()
    for at in _string_fields(_example(operation_id))
]


def _replaced(value: Any, at: tuple[str | int, ...], new: Any) -> Any:
    if not at:
        return new
    copy = json.loads(json.dumps(value))
    target = copy
    for key in at[:-1]:
        target = target[key]
    target[at[-1]] = new
    return copy


def _send(
    served: Served,
    who: str,
    operation_id: str,
    *,
    body: bytes,
    content_type: str,
    extra: dict[str, Any] | None = None,
) -> tuple[requests.Response, list[str]]:
    """Send a body to an operation (any path parameter made up) as `who`."""
    method, template, _ = operation_by_id(operation_id)
    path = re.sub(r"\{[^}]+\}", "abc123", template)
    headers: dict[str, Any] = {"Content-Type": content_type}
    if method not in SAFE_METHODS:
        headers |= served.same_origin()
    headers |= extra or {}
    return _call(served, who, operation_id, path, data=body, headers=headers)


lone_surrogates = st.integers(0xD800, 0xDFFF).map(chr)
with_a_lone_surrogate = st.builds(
    lambda before, surrogate, after: before + surrogate + after,
    st.text(max_size=12),
    lone_surrogates,
    st.text(max_size=12),
)


@pytest.mark.parametrize(("operation_id", "at"), STRING_FIELDS)
@hypothesis.settings(HOSTILE)
@given(text=with_a_lone_surrogate)
@example(text="\ud800")
@example(text="a\udfff")
def test_a_lone_surrogate_in_any_json_string_is_refused(
    served: Served, operation_id: str, at: tuple[str | int, ...], text: str
) -> None:
    """`"\\ud800"` in any string of an otherwise good body: a 4xx, never stored."""
    body = json.dumps(_replaced(_example(operation_id), at, text)).encode()
    assert b"\\ud" in body  # JSON text escapes the lone surrogate
    response, faults = _send(
        served, "signed-in", operation_id, body=body, content_type="application/json"
    )
    assert 400 <= response.status_code < 500, describe(response)
    assert_clean(response, faults)


def _integer_parameters() -> list[Any]:
    found = []
    for _, _, operation in operations():
        for parameter in operation.get("parameters", []):
            if "$ref" in parameter:
                name = parameter["$ref"].rsplit("/", 1)[-1]
                parameter = SPEC["components"]["parameters"][name]
            if parameter["in"] == "query" and parameter["schema"].get("type") in (
                "integer",
                "number",
            ):
                op_id = operation["operationId"]
                found.append(
                    pytest.param(
                        op_id, parameter["name"], id=f"{op_id}:{parameter['name']}"
                    )
                )
    return found


# Digit strings `int()` refuses or `isdigit()` misjudges: past the 4,300-digit
# conversion limit, superscripts, full-width and other scripts' digits. The
# issue's own values are explicit examples, so every run sends them.
ISSUE_DIGITS: Final = ("9" * 4300, "1" * 4301, "7" * 5000, "²", "１２")
huge_or_exotic_digits = st.one_of(
    st.integers(4290, 5100).map(lambda n: "1" * n),
    st.text(
        st.characters(categories=["Nd", "No"], exclude_characters="0123456789"),
        min_size=1,
        max_size=6,
    ),
)


@pytest.mark.parametrize(("operation_id", "name"), _integer_parameters())
@hypothesis.settings(HOSTILE)
@given(value=huge_or_exotic_digits)
@example(value=ISSUE_DIGITS[0])
@example(value=ISSUE_DIGITS[1])
@example(value=ISSUE_DIGITS[2])
@example(value=ISSUE_DIGITS[3])
@example(value=ISSUE_DIGITS[4])
def test_a_huge_or_exotic_number_in_any_integer_parameter_is_a_400(
    served: Served, operation_id: str, name: str, value: str
) -> None:
    """4,301 digits, `²`, `１２`: 400 naming the parameter, like any bad number."""
    _, path, _ = operation_by_id(operation_id)
    response, faults = _call(
        served, "signed-in", operation_id, path, params={name: value}
    )
    assert response.status_code == 400, describe(response)
    assert error_body(response) == {"error": "BAD_REQUEST", "field": name}
    assert_clean(response, faults)


BOUNDARY: Final = "fuzzboundary7MA4YWxkTrZu0gW"
# The smallest PNG there is: the part's content does not matter, its headers do.
PNG: Final = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360000002000005fa2b3f4a0000000049454e44ae426082"
)
control_bytes = st.sampled_from([*range(0x01, 0x09), *range(0x0A, 0x20), 0x7F]).map(
    lambda b: bytes([b])
)
malformed_part_headers = st.one_of(
    # a header line without a colon
    st.from_regex(rb"\A[A-Za-z][A-Za-z-]{0,30}\Z").map(lambda line: [line]),
    # a NUL in the part's name
    st.integers(0, 4).map(
        lambda at: [
            b'Content-Disposition: form-data; name="'
            + b"file"[:at]
            + b"\0"
            + b"file"[at:]
            + b'"; filename="a.png"'
        ]
    ),
    # a control byte in a header value
    control_bytes.map(lambda b: [b"Content-Type: image/" + b + b"png"]),
    # a header line over 8,190 bytes
    st.integers(8191, 9000).map(lambda n: [b"X-Long: " + b"a" * n]),
)


@hypothesis.settings(HOSTILE, max_examples=4 * HOSTILE_EXAMPLES)
@given(bad=malformed_part_headers)
@example(bad=[b"X-Line-Without-Colon"])
@example(bad=[b'Content-Disposition: form-data; name="fi\0le"; filename="a.png"'])
@example(bad=[b"Content-Type: image/\x01png"])
@example(bad=[b"X-Long: " + b"a" * 8191])
def test_a_malformed_multipart_upload_is_a_400(
    served: Served, bad: list[bytes]
) -> None:
    """A part header aiohttp cannot parse is the client's fault: 400, as JSON."""
    disposition = b'Content-Disposition: form-data; name="file"; filename="a.png"'
    headers = bad if bad[0].startswith(b"Content-Disposition") else [disposition, *bad]
    body = b"\r\n".join(
        [
            b"--" + BOUNDARY.encode(),
            *headers,
            b"",
            PNG,
            b"--" + BOUNDARY.encode() + b"--",
            b"",
        ]
    )
    response, faults = _send(
        served,
        "signed-in",
        "uploads",
        body=body,
        content_type=f"multipart/form-data; boundary={BOUNDARY}",
    )
    assert response.status_code == 400, describe(response)
    assert_clean(response, faults)


BODY_ROUTES: Final = [
    operation["operationId"]
    for _, _, operation in operations()
    if "requestBody" in operation
]


def _decodes(data: bytes, encoding: str) -> bool:
    """Would any reader of `encoding` make something of these bytes?"""
    # gzip; deflate as RFC 9110 means it (zlib) and as some clients send it (raw)
    windows = (16 + zlib.MAX_WBITS,) if encoding == "gzip" else (15, -15)
    for wbits in windows:
        try:
            zlib.decompress(data, wbits)
        except zlib.error:
            continue
        return True
    return False


@pytest.mark.parametrize("operation_id", BODY_ROUTES)
@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
@hypothesis.settings(HOSTILE, max_examples=3)
@given(body=st.binary(min_size=1, max_size=64))
@example(body=b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03not gzip")
@example(body=b"x\x9cnot deflate")
def test_a_body_that_does_not_decompress_is_a_4xx(
    served: Served, operation_id: str, encoding: str, body: bytes
) -> None:
    """gzip or deflate that is not: a 4xx as JSON, and no traceback in the log."""
    hypothesis.assume(not _decodes(body, encoding))
    _, _, operation = operation_by_id(operation_id)
    content_type = next(iter(operation["requestBody"]["content"]))
    response, faults = _send(
        served,
        "signed-in",
        operation_id,
        body=body,
        content_type=content_type,
        extra={"Content-Encoding": encoding},
    )
    assert 400 <= response.status_code < 500, describe(response)
    assert_clean(response, faults)


@pytest.mark.parametrize("operation_id", BODY_ROUTES)
@hypothesis.settings(HOSTILE, max_examples=4)
@given(
    encoding=st.sampled_from(["br", "zstd", "compress", "x-snappy", "gzip, br"]),
    body=st.binary(min_size=1, max_size=64),
)
@example(encoding="br", body=b"\x8b\x02\x80")
@example(encoding="zstd", body=b"(\xb5/\xfd")
@example(encoding="x-unknown", body=b"{}")
def test_a_content_encoding_we_do_not_take_is_a_415(
    served: Served, operation_id: str, encoding: str, body: bytes
) -> None:
    """br, zstd or anything unknown: 415 UNSUPPORTED_ENCODING, as JSON."""
    _, _, operation = operation_by_id(operation_id)
    content_type = next(iter(operation["requestBody"]["content"]))
    response, faults = _send(
        served,
        "signed-in",
        operation_id,
        body=body,
        content_type=content_type,
        extra={"Content-Encoding": encoding},
    )
    assert response.status_code == 415, describe(response)
    assert error_body(response) == {"error": "UNSUPPORTED_ENCODING"}
    assert_clean(response, faults)


# A byte of 0x80 or above between ASCII letters is never UTF-8.
not_utf8 = st.builds(
    lambda before, byte, after: before + bytes([byte]) + after,
    st.from_regex(rb"\A[0-9A-Za-z]{0,8}\Z"),
    st.integers(0x80, 0xFF),
    st.from_regex(rb"\A[0-9A-Za-z]{0,8}\Z"),
)


@pytest.mark.parametrize(
    "header", ["Wechatpay-Timestamp", "Wechatpay-Nonce", "Wechatpay-Signature"]
)
@hypothesis.settings(HOSTILE)
@given(value=not_utf8)
@example(value=b"\xff")
def test_a_webhook_header_that_is_not_utf8_is_a_4xx(
    served: Served, header: str, value: bytes
) -> None:
    """With our (public) serial, a header byte that is not UTF-8: a 4xx, not a crash."""
    provider = served.app[PROVIDERS]["wechatpay"]
    assert isinstance(provider, WechatPayProvider)
    serial = provider.config.public_key_id
    signed = {
        "Wechatpay-Timestamp": b"1700000000",
        "Wechatpay-Nonce": b"nonce",
        "Wechatpay-Signature": b"c2lnbmF0dXJl",
        "Wechatpay-Serial": serial.encode(),
        "Wechatpay-Signature-Type": b"WECHATPAY2-SHA256-RSA2048",
    }
    response, faults = _send(
        served,
        "anonymous",
        "webhook_wechatpay",
        body=json.dumps(_example("webhook_wechatpay")).encode(),
        content_type="application/json",
        extra=signed | {header: value},
    )
    assert 400 <= response.status_code < 500, describe(response)
    assert_clean(response, faults)
