"""The pieces the vendors' HMAC-SHA256 request signatures share, written once.

Tencent (TC3), Alibaba (ACS3) and Volcengine (V4) each hash a canonical
request (method, path, query, the signed headers, the body's hash), then sign
a text naming it with an HMAC key of their own derivation.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from urllib.parse import quote


def sha256_hex(data: bytes | str) -> str:
    """Hex SHA-256 of bytes or of a text's UTF-8."""
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


def derived_key(secret: bytes, *parts: str) -> bytes:
    """HMAC-SHA256 the parts in turn, each keyed by the last result."""
    key = secret
    for part in parts:
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return key


def hmac_hex(key: bytes, text: str) -> str:
    """Hex HMAC-SHA256 of a text."""
    return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()


def canonical_request(
    query: Mapping[str, str], headers: Mapping[str, str], body: bytes
) -> tuple[str, str]:
    """A `POST /`'s canonical request, and its signed headers: all given, sorted."""
    values = {name.lower(): value.strip() for name, value in headers.items()}
    names = sorted(values)
    canonical = "\n".join(
        [
            "POST",
            "/",
            "&".join(
                f"{quote(key, safe='-_.~')}={quote(query[key], safe='-_.~')}"
                for key in sorted(query)
            ),
            "".join(f"{name}:{values[name]}\n" for name in names),
            ";".join(names),
            sha256_hex(body),
        ]
    )
    return canonical, ";".join(names)


def scoped_authorization(
    algorithm: str, *, key_id: str, scope: str, stamp: str, canonical: str,
    names: str, key: bytes,
) -> str:  # fmt: skip
    """The Authorization of the AWS-like signatures (TC3, Volcengine's V4).

    They sign `algorithm`, the time, the credential scope and the canonical
    request's hash, one a line, with a key derived along the scope.
    """
    to_sign = f"{algorithm}\n{stamp}\n{scope}\n{sha256_hex(canonical)}"
    return (
        f"{algorithm} Credential={key_id}/{scope}, SignedHeaders={names},"
        f" Signature={hmac_hex(key, to_sign)}"
    )
