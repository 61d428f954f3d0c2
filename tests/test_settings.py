"""Settings: defaults, overlay, variables, and one clear line for every bad value."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from service.settings import SettingsError, load_settings, require_production


def test_defaults_come_from_default_toml() -> None:
    """With no variables the contract's defaults hold."""
    settings = load_settings({})
    assert settings.base_url == "http://127.0.0.1:8080"
    assert (settings.host, settings.port) == ("127.0.0.1", 8080)
    assert (settings.smtp.host, settings.smtp.port, settings.smtp.tls) == (
        "127.0.0.1",
        1025,
        "off",
    )
    assert settings.mail_from == "no-reply@127.0.0.1"
    assert settings.trusted_proxies == ()
    assert settings.redis_url == ""
    assert not settings.https


def test_variables_override_the_overlay_which_overrides_defaults(
    tmp_path: Path,
) -> None:
    """default.toml < STUDIO_CONFIG file < STUDIO_* variables."""
    overlay = tmp_path / "prod.toml"
    overlay.write_text('port = 9000\nhost = "0.0.0.0"\n[smtp]\ntls = "starttls"\n')
    settings = load_settings(
        {
            "STUDIO_CONFIG": str(overlay),
            "STUDIO_PORT": "9100",
            "STUDIO_SMTP_PORT": "2525",
        }
    )
    assert settings.port == 9100
    assert settings.host == "0.0.0.0"
    assert settings.smtp.tls == "starttls"
    assert settings.smtp.port == 2525


def test_every_contract_variable_is_understood() -> None:
    """The names of CONTRACT §1 map onto settings."""
    settings = load_settings(
        {
            "STUDIO_BASE_URL": "https://Studio.Example.com/",
            "STUDIO_HOST": "0.0.0.0",
            "STUDIO_PORT": "80",
            "STUDIO_REDIS_URL": "rediss://cache:6380/1",
            "STUDIO_SMTP_HOST": "smtp.example.com",
            "STUDIO_SMTP_PORT": "465",
            "STUDIO_SMTP_TLS": "tls",
            "STUDIO_SMTP_USERNAME": "mailer",
            "STUDIO_SMTP_PASSWORD": "hunter2",
            "STUDIO_MAIL_FROM": "Sign-in@Example.com",
            "STUDIO_SECRET_KEY": "k" * 40,
            "STUDIO_TRUSTED_PROXIES": "10.0.0.0/8, fd00::/8",
            "STUDIO_CONTACT_EMAIL": "deals@example.com",
        }
    )
    assert settings.base_url == "https://studio.example.com"
    assert settings.https
    assert settings.smtp.tls == "tls"
    assert settings.smtp.password == "hunter2"
    assert settings.mail_from == "Sign-in@example.com"
    assert settings.trusted_proxies == (
        ipaddress.ip_network("10.0.0.0/8"),
        ipaddress.ip_network("fd00::/8"),
    )
    assert "hunter2" not in repr(settings)
    assert "k" * 40 not in repr(settings)


@pytest.mark.parametrize(
    ("environ", "named"),
    [
        ({"STUDIO_PORT": "eighty"}, "STUDIO_PORT"),
        ({"STUDIO_SQUARE_READ_BUDGET": "0"}, "STUDIO_SQUARE_READ_BUDGET"),
        ({"STUDIO_SQUARE_READ_BUDGET": "soon"}, "STUDIO_SQUARE_READ_BUDGET"),
        ({"STUDIO_PORT": "70000"}, "STUDIO_PORT"),
        ({"STUDIO_BASE_URL": "ftp://x"}, "STUDIO_BASE_URL"),
        ({"STUDIO_BASE_URL": "https://x.com/app"}, "STUDIO_BASE_URL"),
        ({"STUDIO_BASE_URL": "https://x.com:99999"}, "STUDIO_BASE_URL"),
        ({"STUDIO_REDIS_URL": "http://redis"}, "STUDIO_REDIS_URL"),
        ({"STUDIO_SMTP_TLS": "ssl"}, "STUDIO_SMTP_TLS"),
        ({"STUDIO_SMTP_PORT": "-1"}, "STUDIO_SMTP_PORT"),
        ({"STUDIO_SECRET_KEY": "short"}, "STUDIO_SECRET_KEY"),
        ({"STUDIO_TRUSTED_PROXIES": "10.0.0.0/33"}, "STUDIO_TRUSTED_PROXIES"),
        ({"STUDIO_CONTACT_EMAIL": "not an address"}, "STUDIO_CONTACT_EMAIL"),
        ({"STUDIO_MAIL_FROM": "a@b@c"}, "STUDIO_MAIL_FROM"),
        ({"STUDIO_REDISURL": "redis://x"}, "STUDIO_REDISURL"),
        ({"STUDIO_CONFIG": "/nonexistent.toml"}, "STUDIO_CONFIG"),
        ({"STUDIO_MODERATION_PROVIDER": "baidu"}, "STUDIO_MODERATION_PROVIDER"),
        (
            {"STUDIO_MODERATION_PROVIDER": "aliyun"},
            "STUDIO_MODERATION_ACCESS_KEY_ID and STUDIO_MODERATION_ACCESS_KEY_SECRET",
        ),
        ({"STUDIO_MODERATION_REGION": "cn.evil/x"}, "STUDIO_MODERATION_REGION"),
        (
            {
                "STUDIO_MODERATION_PROVIDER": "volcengine",
                "STUDIO_MODERATION_ACCESS_KEY_ID": "AK",
                "STUDIO_MODERATION_ACCESS_KEY_SECRET": "SK",
                "STUDIO_MODERATION_APP_ID": "my-app",
            },
            "STUDIO_MODERATION_APP_ID",
        ),
        ({"STUDIO_MODERATION_ENDPOINT": "green-cip"}, "STUDIO_MODERATION_ENDPOINT"),
        # URLs urlsplit itself cannot split
        ({"STUDIO_BASE_URL": "http://[::1"}, "STUDIO_BASE_URL"),
        ({"STUDIO_REDIS_URL": "redis://[::1"}, "STUDIO_REDIS_URL"),
        ({"STUDIO_MEDIA_PUBLIC_URL": "http://[x"}, "STUDIO_MEDIA_PUBLIC_URL"),
        (
            {"STUDIO_UPSTREAMS_OPENAI_BASE_URL": "https://[x"},
            "STUDIO_UPSTREAMS_OPENAI_BASE_URL",
        ),
        ({"STUDIO_JOBS_PER_USER": "2.5"}, "STUDIO_JOBS_PER_USER"),  # not 2
    ],
)
def test_a_bad_value_names_its_variable(environ: dict[str, str], named: str) -> None:
    """Start-up stops with one line that names the setting."""
    with pytest.raises(SettingsError) as caught:
        load_settings(environ)
    message = str(caught.value)
    assert message.startswith(named + ":")
    assert "\n" not in message


def test_overlay_with_an_unknown_key_is_refused(tmp_path: Path) -> None:
    """A typo in the overlay file is an error, not a silent default."""
    overlay = tmp_path / "typo.toml"
    overlay.write_text("prot = 1\n")
    with pytest.raises(SettingsError, match="STUDIO_CONFIG: unknown setting 'prot'"):
        load_settings({"STUDIO_CONFIG": str(overlay)})


@pytest.mark.parametrize(
    ("overlay", "named"),
    [
        (b"[jobs]\nper_user = [1]\n", "STUDIO_JOBS_PER_USER"),
        (b"[jobs]\nper_user = 1979-05-27\n", "STUDIO_JOBS_PER_USER"),
        (b"[jobs]\nper_user = 2.5\n", "STUDIO_JOBS_PER_USER"),
        (b"trial_credits = 10.9\n", "STUDIO_TRIAL_CREDITS"),
        (b"[demo]\nseconds = [1]\n", "STUDIO_DEMO_SECONDS"),
        (b'[demo]\nseconds = "soon"\n', "STUDIO_DEMO_SECONDS"),
        (b'base_url = "\xff"\n', "STUDIO_CONFIG"),  # not UTF-8
    ],
)
def test_an_overlay_value_of_the_wrong_type_names_its_setting(
    tmp_path: Path, overlay: bytes, named: str
) -> None:
    """A list, a date, a fraction or bytes that are no text: one line, no traceback."""
    path = tmp_path / "overlay.toml"
    path.write_bytes(overlay)
    with pytest.raises(SettingsError) as caught:
        load_settings({"STUDIO_CONFIG": str(path)})
    assert str(caught.value).startswith(named + ":")


def test_a_cluster_url_of_several_nodes_is_a_url() -> None:
    """Its netloc lists host:port pairs: no single port to read, and none refused."""
    url = "redis+cluster://127.0.0.1:7000,127.0.0.1:7001,127.0.0.1:7002"
    assert load_settings({"STUDIO_REDIS_URL": url}).redis_url == url


def test_serve_requires_redis_and_a_secret() -> None:
    """Production refuses to start without the two settings it cannot default."""
    with pytest.raises(SettingsError, match=r"^STUDIO_REDIS_URL: required by serve$"):
        require_production(load_settings({"STUDIO_SECRET_KEY": "k" * 32}))
    with pytest.raises(SettingsError, match=r"^STUDIO_SECRET_KEY: required by serve$"):
        require_production(load_settings({"STUDIO_REDIS_URL": "redis://r:6379/0"}))
