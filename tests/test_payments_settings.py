"""Payment settings: a channel whole or absent, keys that load, the fake announced."""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
import urllib.request

import pytest
from pytest_aiohttp import AiohttpClient
from redis.asyncio import Redis

from service.app import create_app
from service.payments import signing
from service.payments.context import opened
from service.payments.providers.alipay import AlipayProvider
from service.settings import ROOT, SettingsError, load_settings
from service.store.embedded import MailCatcher, RedisServer

from .conftest import TEST_SECRET, SettingsFactory
from .payments import fake_keys
from .ports import free_port
from .processes import output_of, running, studio_environ
from .shop import buy, credits, provider_environ
from .workbench import sign_in


def test_no_channel_settings_means_no_channel() -> None:
    """The defaults configure neither channel and leave the fake off."""
    payments = load_settings({}).payments
    assert (payments.alipay, payments.wechatpay, payments.fake) == (None, None, False)
    assert payments.order_minutes == 15
    assert load_settings({}).limits["orders"].quota == 20


def test_complete_channel_settings_load_and_keys_stay_out_of_reprs() -> None:
    """Every variable of CONTRACT §8 is understood; no key text in a repr."""
    keys = fake_keys()
    settings = load_settings(provider_environ(keys, "https://pay.example.com"))
    alipay, wechatpay = settings.payments.alipay, settings.payments.wechatpay
    assert alipay is not None
    assert wechatpay is not None
    assert alipay.app_id == keys.alipay_app_id
    assert wechatpay.base_url == "https://pay.example.com/fake-pay/wechatpay"
    shown = repr(settings)
    for secret in (keys.app_private_pem, keys.merchant_private_pem, keys.apiv3_key):
        assert secret.splitlines()[1 if "\n" in secret else 0] not in shown


@pytest.mark.parametrize(
    ("given", "named"),
    [
        (
            {"STUDIO_PAYMENTS_ALIPAY_APP_ID": "2021"},
            "STUDIO_PAYMENTS_ALIPAY_PRIVATE_KEY",
        ),
        (
            {"STUDIO_PAYMENTS_WECHATPAY_APIV3_KEY": "k" * 32},
            "STUDIO_PAYMENTS_WECHATPAY_MCHID",
        ),
    ],
)
def test_a_channel_with_some_of_its_settings_stops_start_up(
    given: dict[str, str], named: str
) -> None:
    """Half a channel is a mistake: the first missing variable is named."""
    with pytest.raises(SettingsError, match=named):
        load_settings(given)


def test_keys_must_load_and_are_never_echoed() -> None:
    """A key that is not an RSA key of 2048+ bits names its variable, not its text."""
    environ = provider_environ(fake_keys(), "https://pay.example.com")
    environ["STUDIO_PAYMENTS_WECHATPAY_PUBLIC_KEY"] = "not-a-key-SECRETISH"
    with pytest.raises(SettingsError) as refused:
        load_settings(environ)
    assert str(refused.value).startswith("STUDIO_PAYMENTS_WECHATPAY_PUBLIC_KEY:")
    assert "SECRETISH" not in str(refused.value)
    environ = provider_environ(fake_keys(), "https://pay.example.com")
    environ["STUDIO_PAYMENTS_WECHATPAY_APIV3_KEY"] = "short"
    with pytest.raises(SettingsError, match="STUDIO_PAYMENTS_WECHATPAY_APIV3_KEY"):
        load_settings(environ)
    # A key with literal \n (what some secret stores hold) loads like the PEM.
    environ = provider_environ(fake_keys(), "https://pay.example.com")
    pem = environ["STUDIO_PAYMENTS_ALIPAY_PRIVATE_KEY"]
    environ["STUDIO_PAYMENTS_ALIPAY_PRIVATE_KEY"] = pem.replace("\n", "\\n")
    alipay = load_settings(environ).payments.alipay
    assert alipay is not None
    assert signing.load_private_key(alipay.private_key)


def test_serve_refuses_half_a_channel_with_one_line() -> None:
    """Exit 2, one line naming the variable."""
    result = subprocess.run(
        [sys.executable, "-m", "service", "serve"],
        cwd=ROOT,
        env=studio_environ(
            STUDIO_REDIS_URL="redis://127.0.0.1:1/0",
            STUDIO_SECRET_KEY=TEST_SECRET,
            STUDIO_PAYMENTS_WECHATPAY_MCHID="1900000001",
        ),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "studio: configuration error: STUDIO_PAYMENTS_WECHATPAY_APPID: required"
        " when STUDIO_PAYMENTS_WECHATPAY_MCHID is set"
    ]


@pytest.mark.parametrize("command", ["serve", "worker"])
@pytest.mark.parametrize(
    ("variables", "said"),
    [
        pytest.param(
            {"STUDIO_BASE_URL": "https://studio.example.com"},
            "not with an https STUDIO_BASE_URL",
            id="https",
        ),
        pytest.param(
            provider_environ(fake_keys(), "https://pay.example.com"),
            "not with real channel keys",
            id="channel-keys",
        ),
    ],
)
def test_a_production_process_refuses_the_fake_provider(
    redis_server: RedisServer, command: str, variables: dict[str, str], said: str
) -> None:
    """Where real money could be asked for, anyone could "pay" for nothing: exit 2."""
    environ = studio_environ(
        STUDIO_REDIS_URL=redis_server.url,
        STUDIO_SECRET_KEY=TEST_SECRET,
        STUDIO_PORT=str(free_port()),
        STUDIO_PAYMENTS_FAKE="1",
        **variables,
    )
    try:
        result = subprocess.run(
            [sys.executable, "-m", "service", command],
            cwd=ROOT,
            env=environ,
            capture_output=True,
            text=True,
            timeout=15,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"{command} started with STUDIO_PAYMENTS_FAKE=1")
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("studio: configuration error: STUDIO_PAYMENTS_FAKE: ")
    assert said in lines[0]
    assert "Traceback" not in result.stderr + result.stdout


def test_serve_warns_when_the_fake_provider_is_on(redis_server: RedisServer) -> None:
    """STUDIO_PAYMENTS_FAKE=1: a warning at start, both channels offered."""
    variables = {
        "STUDIO_REDIS_URL": redis_server.url,
        "STUDIO_SECRET_KEY": TEST_SECRET,
        "STUDIO_PAYMENTS_FAKE": "1",
    }
    with running("serve", variables) as (base_url, process):
        output_of(process).wait_for("STUDIO_PAYMENTS_FAKE is on")
        with urllib.request.urlopen(f"{base_url}/api/packs") as response:
            channels = json.loads(response.read())["channels"]
        assert all(channel["available"] for channel in channels)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=15) == 0


async def test_with_the_fake_on_a_whole_purchase_runs_inside_the_service(
    aiohttp_client: AiohttpClient,
    make_settings: SettingsFactory,
    redis: Redis,
    mail_server: MailCatcher,
) -> None:
    """make run's mode: the order leads to the service's own fake page; pay credits."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    settings = make_settings(STUDIO_BASE_URL=base, STUDIO_PAYMENTS_FAKE="1")
    client = await aiohttp_client(
        create_app(settings), server_kwargs={"host": "127.0.0.1", "port": port}
    )
    await sign_in(client, mail_server)
    order = await buy(client, "p98", "alipay")
    response = await client.get(order["action"]["url"].removeprefix(base))
    assert response.status == 200  # the gateway sent the browser to the fake's page
    page = response.url.path
    assert page == f"/fake-pay/alipay/checkout/{order['id']}"
    paid = await client.post(f"{page}/pay", allow_redirects=False)
    assert paid.status == 303
    assert (await credits(client))["balance"] == 100 + 1060


async def test_a_worker_reaches_the_fake_gateway_where_it_is_told(
    redis: Redis, make_settings: SettingsFactory
) -> None:
    """Queries go to payments.fake_gateway_url; browsers still see base_url."""
    settings = make_settings(
        STUDIO_PAYMENTS_FAKE="1",
        STUDIO_PAYMENTS_FAKE_GATEWAY_URL="http://proxy:8080/",
    )
    async with opened(settings, redis) as (providers, _, gateway):
        alipay = providers["alipay"]
        assert isinstance(alipay, AlipayProvider)
        assert alipay.config.gateway == "http://proxy:8080/fake-pay/alipay/gateway.do"
        assert gateway is not None
        assert gateway.public_url == settings.base_url
    with pytest.raises(SettingsError, match="STUDIO_PAYMENTS_FAKE_GATEWAY_URL"):
        load_settings({"STUDIO_PAYMENTS_FAKE_GATEWAY_URL": "proxy:8080"})


@pytest.mark.parametrize(
    ("base_url", "warned"), [("http://127.0.0.1:8080", True), ("https://a.cn", False)]
)
async def test_real_wechat_pay_on_a_plain_http_base_url_is_warned_about(
    aiohttp_client: AiohttpClient,
    make_settings: SettingsFactory,
    redis: Redis,
    caplog: pytest.LogCaptureFixture,
    base_url: str,
    warned: bool,
) -> None:
    """WeChat Pay sends notices only to https (reference I §2.2): start-up says so."""
    environ = provider_environ(fake_keys(), "https://pay.example.com")
    settings = make_settings(**environ, STUDIO_BASE_URL=base_url)
    with caplog.at_level(logging.WARNING, logger="service.payments.context"):
        await aiohttp_client(create_app(settings))
    said = "WeChat Pay sends its notices only to https" in caplog.text
    assert said is warned
