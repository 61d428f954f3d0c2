"""The providers' cryptography: key loading, RSA2 signatures, AES-256-GCM."""

from __future__ import annotations

import base64
import functools

import pytest
from alipay import AliPay
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from hypothesis import given, settings, strategies as st
from wechatpayv3.utils import aes_decrypt, rsa_sign, rsa_verify

from service.payments import signing
from service.payments.providers import wechatpay


@functools.cache
def key() -> rsa.RSAPrivateKey:
    return signing.generate_private_key()


@functools.cache
def other() -> rsa.RSAPrivateKey:
    return signing.generate_private_key()


def bare(pem: str) -> str:
    """The base64 body of a PEM, as Alipay's console hands keys out."""
    return "".join(line for line in pem.splitlines() if not line.startswith("-----"))


def pkcs1_private() -> str:
    return (
        key()
        .private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
        .decode()
    )


def pkcs1_public() -> str:
    return (
        key()
        .public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.PKCS1)
        .decode()
    )


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(lambda: signing.private_pem(key()), id="pkcs8-pem"),
        pytest.param(pkcs1_private, id="pkcs1-pem"),
        pytest.param(lambda: bare(signing.private_pem(key())), id="pkcs8-bare"),
        pytest.param(lambda: bare(pkcs1_private()), id="pkcs1-bare"),
    ],
)
def test_a_private_key_loads_from_pem_or_its_bare_body(text: object) -> None:
    assert callable(text)
    loaded = signing.load_private_key(text())
    assert loaded.private_numbers() == key().private_numbers()


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(lambda: signing.public_pem(key()), id="spki-pem"),
        pytest.param(pkcs1_public, id="pkcs1-pem"),
        pytest.param(lambda: bare(signing.public_pem(key())), id="spki-bare"),
    ],
)
def test_a_public_key_loads_from_pem_or_its_bare_body(text: object) -> None:
    assert callable(text)
    assert signing.load_public_key(text()).public_numbers() == (
        key().public_key().public_numbers()
    )


def test_a_bare_body_wrapped_over_lines_loads() -> None:
    body = bare(signing.public_pem(key()))
    wrapped = "\n".join(body[i : i + 64] for i in range(0, len(body), 64))
    assert signing.load_public_key(wrapped).public_numbers() == (
        key().public_key().public_numbers()
    )


@pytest.mark.parametrize(
    "text",
    [
        "",
        "not a key",
        "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
        "MIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEA",  # a truncated bare body
    ],
)
def test_garbage_is_not_a_key(text: str) -> None:
    with pytest.raises(signing.BadKey):
        signing.load_private_key(text)
    with pytest.raises(signing.BadKey):
        signing.load_public_key(text)


def test_a_short_or_non_rsa_key_is_refused() -> None:
    short = rsa.generate_private_key(public_exponent=65537, key_size=1024)
    with pytest.raises(signing.BadKey):
        signing.load_private_key(signing.private_pem(short))
    with pytest.raises(signing.BadKey):
        signing.load_public_key(signing.public_pem(short))
    curve = ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    with pytest.raises(signing.BadKey):
        signing.load_private_key(curve.decode())


def test_a_signature_verifies_only_for_its_message_and_key() -> None:
    message = b"app_id=2021&biz_content={}&method=alipay.trade.query"
    signature = signing.sign(key(), message)
    assert signing.verify(key().public_key(), message, signature)
    assert not signing.verify(key().public_key(), message + b"x", signature)
    assert not signing.verify(other().public_key(), message, signature)
    assert not signing.verify(key().public_key(), message, "not base64!")
    assert not signing.verify(key().public_key(), message, "")


@functools.cache
def alipay_sdk() -> AliPay:
    return AliPay(
        appid="2021",
        app_private_key_string=signing.private_pem(key()),
        alipay_public_key_string=signing.public_pem(key()),
    )


@settings(max_examples=25, deadline=None)
@given(st.text())
def test_the_sdks_and_we_agree_on_rsa2_signatures(text: str) -> None:
    """python-alipay-sdk (pycryptodome) checks ours, and we the SDK's."""
    sdk = alipay_sdk()
    ours = signing.sign(key(), text.encode())
    assert sdk._verify(text, ours)
    assert signing.verify(key().public_key(), text.encode(), sdk._sign(text))


def _changed(text: str) -> str:
    """The text with one byte of it changed (or one added to an empty one)."""
    if not text:
        return "x"
    return text[:-1] + ("y" if text[-1] == "x" else "x")


@settings(max_examples=25, deadline=None)
@given(st.text())
def test_wechatpayv3_and_we_agree_on_a_framed_wechat_signature(text: str) -> None:
    """Timestamp, nonce and body framed as WeChat Pay signs them: both say yes.

    Signed by us over our framing, by wechatpayv3 over its own: the same
    signature, which both verifications accept, and both refuse for a body
    with one byte changed.
    """
    public = key().public_key()
    framed = wechatpay.message("1700000000", "NONCE", text.encode())
    ours = signing.sign(key(), framed)
    assert rsa_sign(key(), f"1700000000\nNONCE\n{text}\n") == ours
    assert rsa_verify("1700000000", "NONCE", text, ours, public) is True
    assert signing.verify(public, framed, ours) is True
    changed = _changed(text)
    assert rsa_verify("1700000000", "NONCE", changed, ours, public) is False
    reframed = wechatpay.message("1700000000", "NONCE", changed.encode())
    assert signing.verify(public, reframed, ours) is False


API_V3_KEY = "0123456789abcdef0123456789ABCDEF"


@settings(max_examples=25, deadline=None)
@given(st.binary(max_size=400), st.sampled_from(["", "transaction", "refund"]))
def test_aes_gcm_round_trips_and_wechatpayv3_decrypts_it(
    plain: bytes, associated_data: str
) -> None:
    aes = signing.aes_key(API_V3_KEY)
    sealed = signing.aes_gcm_encrypt(aes, "0123456789ab", plain, associated_data)
    assert (
        signing.aes_gcm_decrypt(aes, "0123456789ab", sealed, associated_data) == plain
    )
    try:
        text = plain.decode()
    except UnicodeDecodeError:
        return
    assert aes_decrypt("0123456789ab", sealed, associated_data, API_V3_KEY) == text


def test_aes_gcm_refuses_a_wrong_key_data_nonce_or_tampering() -> None:
    aes = signing.aes_key(API_V3_KEY)
    sealed = signing.aes_gcm_encrypt(aes, "0123456789ab", b'{"a":1}', "transaction")
    raw = bytearray(base64.b64decode(sealed))
    raw[0] ^= 1
    tampered = base64.b64encode(raw).decode()
    wrong_key = signing.aes_key("x" * 32)
    for args in [
        (wrong_key, "0123456789ab", sealed, "transaction"),
        (aes, "0123456789ac", sealed, "transaction"),
        (aes, "0123456789ab", sealed, "refund"),
        (aes, "0123456789ab", tampered, "transaction"),
        (aes, "0123456789ab", "not base64!", "transaction"),
    ]:
        with pytest.raises(signing.Undecryptable):
            signing.aes_gcm_decrypt(*args)


def test_an_apiv3_key_is_32_characters() -> None:
    assert signing.aes_key(API_V3_KEY) == API_V3_KEY.encode()
    with pytest.raises(signing.BadKey):
        signing.aes_key("short")
