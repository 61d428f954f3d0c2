"""`make run`'s own certificate authority and C2PA signing certificate, made once.

Local only: verifiers do not trust this CA (it is on no C2PA trust list), but
every file is signed as in production, and `studio labels check` trusts it.
"""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path
from typing import Final

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

ORGANIZATION: Final = "Liuguang Studio (local development)"


def _name(common: str) -> x509.Name:
    # c2pa-rs refuses a signer whose subject has no organisation (O=).
    return x509.Name(
        [
            x509.NameAttribute(NameOID.COUNTRY_NAME, "CN"),
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, ORGANIZATION),
            x509.NameAttribute(NameOID.COMMON_NAME, common),
        ]
    )


def _usage(*, sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=not sign,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=sign,
        crl_sign=sign,
        encipher_only=False,
        decipher_only=False,
    )


def make_chain(days: int = 825) -> tuple[bytes, bytes, bytes]:
    """Make a CA and a signer it certifies: (chain PEM leaf first, key PEM, CA PEM).

    The signer is what C2PA asks of one: an end-entity (CA:false) certificate
    with digitalSignature, an accepted extended key usage (emailProtection)
    and its authority's key identifier; a self-signed one is refused.
    """
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name("Liuguang Studio local C2PA CA"))
        .issuer_name(_name("Liuguang Studio local C2PA CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + dt.timedelta(days=days + 30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_usage(sign=True), critical=True)
        .add_extension(
            x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = (
        x509.CertificateBuilder()
        .subject_name(_name("Liuguang Studio C2PA signer"))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_usage(sign=False), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.EMAIL_PROTECTION]),
            critical=False,
        )
        .add_extension(
            x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    ca_pem = ca.public_bytes(pem)
    key_pem = key.private_bytes(
        pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return leaf.public_bytes(pem) + ca_pem, key_pem, ca_pem


def local_signing_files(data_dir: Path) -> tuple[Path, Path]:
    """Return (chain, key) under data_dir/c2pa/, making them the first time."""
    folder = data_dir / "c2pa"
    chain, key = folder / "chain.pem", folder / "signer-key.pem"
    if chain.is_file() and key.is_file():
        return chain, key
    folder.mkdir(parents=True, exist_ok=True)
    chain_pem, key_pem, ca_pem = make_chain()
    (folder / "ca.pem").write_bytes(ca_pem)
    descriptor = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "wb") as file:
        file.write(key_pem)
    chain.write_bytes(chain_pem)  # last: its presence says the pair is complete
    return chain, key
