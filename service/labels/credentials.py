"""Content Credentials (C2PA): sign a finished file last, and read a file's manifest.

c2pa-python wraps the C2PA reference implementation (c2pa-rs, native, in the
wheel). A file is signed after its labels are written, since the manifest binds
the bytes; the manifest says the work was created by a trained algorithm.
"""

from __future__ import annotations

import functools
import io
import json
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Final

import c2pa
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.hazmat.primitives.serialization import load_pem_private_key

from ..settings import LabelsSettings
from .implicit import TRAINED, LabelError

GENERATOR: Final = "Liuguang Studio 流光工坊"
MIME: Final = {
    "png": "image/png",
    "jpg": "image/jpeg",
    "webp": "image/webp",
    "mp4": "video/mp4",
}
# A manifest that reads back in one of these states was signed intact.
GOOD_STATES: Final = frozenset({"Valid", "Trusted"})
_CURVES: Final = {
    "secp256r1": c2pa.C2paSigningAlg.ES256,
    "secp384r1": c2pa.C2paSigningAlg.ES384,
    "secp521r1": c2pa.C2paSigningAlg.ES512,
}


def _service_version() -> str:
    try:
        return version("studio-service")
    except PackageNotFoundError:
        return "0"


@dataclass(frozen=True, slots=True)
class SigningKey:
    """The operator's chain (leaf first) and key, read and checked once."""

    chain: bytes
    key: bytes
    alg: Any  # c2pa.C2paSigningAlg

    @property
    def anchors(self) -> str:
        """The chain's certificates, trusted when reading our own files back."""
        return self.chain.decode()


@functools.lru_cache(maxsize=4)
def signing_key(cert: Path, key: Path) -> SigningKey:
    """Load the PEM files; refuse a key the chain's leaf does not certify."""
    chain, secret = cert.read_bytes(), key.read_bytes()
    try:
        leaf = x509.load_pem_x509_certificates(chain)[0]
        private = load_pem_private_key(secret, password=None)
    except ValueError as err:
        raise LabelError(f"the C2PA certificate or key is not PEM: {err}") from err
    if (
        isinstance(private, ec.EllipticCurvePrivateKey)
        and private.curve.name in _CURVES
    ):
        alg = _CURVES[private.curve.name]
    elif isinstance(private, rsa.RSAPrivateKey):
        alg = c2pa.C2paSigningAlg.PS256
    elif isinstance(private, ed25519.Ed25519PrivateKey):
        alg = c2pa.C2paSigningAlg.ED25519
    else:
        raise LabelError("the C2PA key is not EC P-256/384/521, RSA or Ed25519")
    if leaf.public_key() != private.public_key():
        raise LabelError(
            "the C2PA key does not belong to the chain's first certificate"
        )
    return SigningKey(chain, secret, alg)


def manifest(title: str) -> dict[str, Any]:
    """The manifest of CONTRACT §10: created, by a trained algorithm, by us."""
    return {
        "claim_generator_info": [{"name": GENERATOR, "version": _service_version()}],
        "title": title,
        "assertions": [
            {
                "label": "c2pa.actions",
                "data": {
                    "actions": [
                        {
                            "action": "c2pa.created",
                            "digitalSourceType": TRAINED,
                            "softwareAgent": {"name": GENERATOR},
                        }
                    ]
                },
            }
        ],
    }


def sign(settings: LabelsSettings, data: bytes, extension: str, title: str) -> bytes:
    """Sign the file's bytes as they are; unchanged when no certificate is set."""
    if settings.c2pa_cert is None or settings.c2pa_key is None:
        return data
    key = signing_key(settings.c2pa_cert, settings.c2pa_key)
    info = c2pa.C2paSignerInfo(
        alg=key.alg, sign_cert=key.chain, private_key=key.key, ta_url=None
    )
    context = c2pa.Context.from_dict({"builder": {"thumbnail": {"enabled": False}}})
    target = io.BytesIO()
    try:
        with (
            c2pa.Signer.from_info(info) as signer,
            c2pa.Builder(manifest(title), context) as builder,
        ):
            builder.sign(signer, MIME[extension], io.BytesIO(data), target)
    except c2pa.C2paError as err:
        raise LabelError(f"C2PA signing failed: {err}") from err
    return target.getvalue()


@dataclass(frozen=True, slots=True)
class Credentials:
    """A file's C2PA manifest store as read: its state and what it says."""

    state: str  # Trusted | Valid | Invalid
    manifests: int
    generator: str
    actions: list[dict[str, Any]]


def read_credentials(
    data: bytes, extension: str, anchors: str | None = None
) -> Credentials | None:
    """Validate a file's manifest (None when it has none), offline."""
    settings: dict[str, Any] = {
        "verify": {"remote_manifest_fetch": False, "ocsp_fetch": False}
    }
    if anchors:
        settings["trust"] = {"user_anchors": anchors}
    try:
        with c2pa.Reader(
            MIME[extension], io.BytesIO(data), context=c2pa.Context.from_dict(settings)
        ) as reader:
            store = json.loads(reader.json())
            state = str(reader.get_validation_state())
    except c2pa.C2paError:
        return None
    active = store.get("manifests", {}).get(store.get("active_manifest"), {})
    generators = active.get("claim_generator_info") or [{}]
    actions = [
        action
        for assertion in active.get("assertions", [])
        if str(assertion.get("label", "")).startswith("c2pa.actions")
        for action in assertion.get("data", {}).get("actions", [])
    ]
    return Credentials(
        state=state,
        manifests=len(store.get("manifests", {})),
        generator=str(generators[0].get("name", "")),
        actions=actions,
    )


def trust_anchors(settings: LabelsSettings) -> str | None:
    """The configured chain, to trust our own signatures when reading them back."""
    if settings.c2pa_cert is None or settings.c2pa_key is None:
        return None
    return signing_key(settings.c2pa_cert, settings.c2pa_key).anchors
