"""The providers' cryptography: RSA PKCS#1 v1.5 / SHA-256 and AES-256-GCM."""

from __future__ import annotations

import base64
import binascii
import functools

from cryptography.exceptions import InvalidSignature, InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.hazmat.primitives.ciphers.aead import AESGCM


class BadKey(ValueError):
    """A key setting that is not an RSA key of the expected kind."""


class Undecryptable(ValueError):
    """A ciphertext that does not decrypt and authenticate with the key."""


def _der(text: str) -> bytes | None:
    """The DER bytes of a bare base64 key body (as Alipay's console shows it)."""
    try:
        return base64.b64decode("".join(text.split()), validate=True)
    except binascii.Error:
        return None


# Loading checks the key (~70 ms for RSA-2048): each text is loaded only once.
@functools.lru_cache(maxsize=64)
def load_private_key(text: str) -> rsa.RSAPrivateKey:
    """Load an RSA private key: PEM (PKCS#8 or PKCS#1), or its bare base64 body."""
    try:
        if "-----BEGIN" in text:
            key = serialization.load_pem_private_key(text.encode(), password=None)
        else:
            der = _der(text)
            if der is None:
                raise BadKey("not PEM and not base64")
            key = serialization.load_der_private_key(der, password=None)
    except (ValueError, TypeError) as error:
        raise BadKey("not a readable private key") from error
    if not isinstance(key, rsa.RSAPrivateKey) or key.key_size < 2048:
        raise BadKey("not an RSA private key of at least 2048 bits")
    return key


@functools.lru_cache(maxsize=64)
def load_public_key(text: str) -> rsa.RSAPublicKey:
    """Load an RSA public key: PEM (SPKI or PKCS#1), or its bare base64 body."""
    try:
        if "-----BEGIN" in text:
            key = serialization.load_pem_public_key(text.encode())
        else:
            der = _der(text)
            if der is None:
                raise BadKey("not PEM and not base64")
            key = serialization.load_der_public_key(der)
    except (ValueError, TypeError) as error:
        raise BadKey("not a readable public key") from error
    if not isinstance(key, rsa.RSAPublicKey) or key.key_size < 2048:
        raise BadKey("not an RSA public key of at least 2048 bits")
    return key


def generate_private_key() -> rsa.RSAPrivateKey:
    """Make a fresh RSA-2048 key (the fake provider and the tests)."""
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def private_pem(key: rsa.RSAPrivateKey) -> str:
    """The PKCS#8 PEM text of a private key."""
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()


def public_pem(key: rsa.RSAPrivateKey | rsa.RSAPublicKey) -> str:
    """The SPKI PEM text of a key's public half."""
    public = key.public_key() if isinstance(key, rsa.RSAPrivateKey) else key
    return public.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    ).decode()


def sign(key: rsa.RSAPrivateKey, message: bytes) -> str:
    """RSA PKCS#1 v1.5 over SHA-256, base64 (both providers' "RSA2")."""
    signature = key.sign(message, padding.PKCS1v15(), hashes.SHA256())
    return base64.b64encode(signature).decode()


def verify(key: rsa.RSAPublicKey, message: bytes, signature: str) -> bool:
    """Check a base64 RSA2 signature; any malformed input is simply False."""
    try:
        raw = base64.b64decode(signature.strip(), validate=True)
        key.verify(raw, message, padding.PKCS1v15(), hashes.SHA256())
    except (binascii.Error, InvalidSignature, ValueError):
        return False
    return True


def aes_key(text: str) -> bytes:
    """The 32-byte AES-256 key of a WeChat Pay APIv3 key setting."""
    key = text.encode()
    if len(key) != 32:
        raise BadKey("an APIv3 key is 32 characters")
    return key


def aes_gcm_decrypt(
    key: bytes, nonce: str, ciphertext: str, associated_data: str
) -> bytes:
    """Decrypt a WeChat Pay resource (base64 ciphertext with its 16-byte tag)."""
    try:
        data = base64.b64decode(ciphertext, validate=True)
        return AESGCM(key).decrypt(nonce.encode(), data, associated_data.encode())
    except (binascii.Error, InvalidTag, ValueError) as error:
        raise Undecryptable("the resource does not decrypt") from error


def aes_gcm_encrypt(
    key: bytes, nonce: str, plaintext: bytes, associated_data: str
) -> str:
    """Encrypt as WeChat Pay does (for the fake provider): base64 of data + tag."""
    sealed = AESGCM(key).encrypt(nonce.encode(), plaintext, associated_data.encode())
    return base64.b64encode(sealed).decode()
