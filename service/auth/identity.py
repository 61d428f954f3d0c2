"""Normalise e-mail addresses and key them by HMAC: no raw address in a Redis key."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterator
from dataclasses import dataclass, field

from email_validator import EmailNotValidError, validate_email

from ..api.errors import ApiError

# RFC 5321's path limit; email-validator enforces the parts, this caps the whole.
MAX_ADDRESS_LENGTH = 254


@dataclass(frozen=True, slots=True)
class Address:
    """A validated address: as shown, as mailed to, and the key it is filed under."""

    email: str
    key: str
    mail_to: str


def parse_address(raw: object, secret_key: str) -> Address:
    """Validate (no DNS), normalise and lower-case, or raise INVALID_EMAIL."""
    if not isinstance(raw, str) or not raw or len(raw) > MAX_ADDRESS_LENGTH:
        raise ApiError(400, "INVALID_EMAIL")
    try:
        info = validate_email(
            raw.strip(),
            check_deliverability=False,
            allow_smtputf8=False,
            allow_quoted_local=False,
            allow_domain_literal=False,
            allow_display_name=False,
        )
    except EmailNotValidError as err:
        raise ApiError(400, "INVALID_EMAIL") from err
    email = info.normalized.lower()
    # IDNA (punycode) domain for the envelope: relays need not speak SMTPUTF8.
    mail_to = (info.ascii_email or info.normalized).lower()
    return Address(email=email, key=address_key(email, secret_key), mail_to=mail_to)


def address_key(email: str, secret_key: str) -> str:
    """Return the HMAC of a normalised address: 32 hex characters, brace-free."""
    digest = hmac.new(secret_key.encode(), b"email:" + email.encode(), hashlib.sha256)
    return digest.hexdigest()[:32]


def key_id(secret_key: str) -> str:
    """Name a secret key without revealing it: 8 hex digits of a MAC of a constant."""
    return hmac.new(secret_key.encode(), b"key-id", hashlib.sha256).hexdigest()[:8]


@dataclass(frozen=True, slots=True)
class Keyring:
    """The secret key addresses are filed under now, and the one it replaced.

    STUDIO_SECRET_KEY_PREVIOUS keeps finding what was filed under the old key
    while STUDIO_SECRET_KEY files everything anew.
    """

    current: str = field(repr=False)
    previous: str = field(default="", repr=False)

    def filings(self, email: str) -> Iterator[tuple[str, str]]:
        """Yield (key id, address HMAC) of an address, the current key first."""
        for secret in dict.fromkeys(s for s in (self.current, self.previous) if s):
            yield key_id(secret), address_key(email, secret)
