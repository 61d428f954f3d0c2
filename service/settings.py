"""Load the settings once at start-up, validated, so nothing runs half-configured."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal, cast
from urllib.parse import SplitResult, urlsplit

from email_validator import EmailNotValidError, validate_email

from .limits.limiter import Policy
from .store.connect import CLUSTER_SCHEMES

PACKAGE: Final = Path(__file__).resolve().parent
# The checkout the package sits in (compose.yaml, the tests); not used when installed.
ROOT: Final = PACKAGE.parent


def resource_dir(name: str) -> Path:
    """Find config/, content/ or templates/ in a wheel's package or a checkout.

    The wheel maps them into the package (pyproject.toml's package-dir); a
    checkout, and its editable install, keeps them at the top level. A path, not
    importlib.resources: `service.content` is also the name of a module.
    """
    packaged = PACKAGE / name
    return packaged if packaged.is_dir() else ROOT / name


DEFAULT_CONFIG: Final = resource_dir("config") / "default.toml"
ENV_PREFIX: Final = "STUDIO_"
OVERLAY_VARIABLE: Final = "STUDIO_CONFIG"

REDIS_SCHEMES: Final = ("redis", "rediss", "unix", "redis+cluster", "rediss+cluster")

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
SmtpTls = Literal["off", "starttls", "tls"]
UpstreamProtocol = Literal[
    "openai", "fal", "replicate", "ark", "dashscope", "kling", "minimax", "comfyui",
    "demo",
]  # fmt: skip
UPSTREAM_PROTOCOLS: Final = (
    "openai", "fal", "replicate", "ark", "dashscope", "kling", "minimax", "comfyui",
    "demo",
)  # fmt: skip
# Protocols that need no key: an empty base_url leaves them off instead.
KEYLESS_PROTOCOLS: Final = ("comfyui",)
# The fields of an [upstreams.NAME] section, with the defaults of a new name.
UPSTREAM_FIELDS: Final[dict[str, Any]] = {
    "protocol": "",
    "base_url": "",
    "api_key": "",
    "max_in_flight": 0,
    "timeout": 120.0,
}


class SettingsError(ValueError):
    """A setting is missing or malformed; the message names its variable."""


@dataclass(frozen=True, slots=True)
class SmtpSettings:
    host: str
    port: int
    tls: SmtpTls
    username: str
    password: str = field(repr=False)
    timeout: float


@dataclass(frozen=True, slots=True)
class UpstreamSettings:
    """One model upstream (CONTRACT §7): how to reach it and how hard to push."""

    name: str
    protocol: UpstreamProtocol
    base_url: str
    api_key: str = field(repr=False)
    # Jobs in flight across the whole fleet (0: no limit).
    max_in_flight: int
    # Seconds one request to it may take (connect and each read).
    timeout: float


@dataclass(frozen=True, slots=True)
class MediaS3Settings:
    """An S3-compatible bucket for media (CONTRACT §6): machines share it."""

    # Empty: AWS S3 itself in the region; else the server's URL (path-style).
    endpoint: str
    bucket: str
    region: str
    # Both empty: the usual AWS sources (environment variables, an instance role).
    access_key_id: str
    secret_access_key: str = field(repr=False)


# The moderation providers `moderation.provider` may name.
MODERATION_PROVIDERS: Final = ("none", "aliyun", "tencent", "volcengine")


@dataclass(frozen=True, slots=True)
class ModerationSettings:
    """Content safety (CONTRACT §11): the log's keeping, the list's reading."""

    # Days a moderation log record is kept before its day is dropped.
    log_days: int = 180
    # Seconds between looks at content/moderation/blocked.txt for changes.
    reload_seconds: float = 10.0
    # A cloud moderation service for prompts (after the list), outputs and
    # uploads: "none", "aliyun", "tencent" or "volcengine"; its key pair, region
    # and endpoint ("": the provider's own default).
    provider: str = "none"
    access_key_id: str = ""
    access_key_secret: str = field(default="", repr=False)
    region: str = ""
    endpoint: str = ""
    # Volcengine's application id (a number) and business type, from its console.
    app_id: str = ""
    biz_type: str = ""
    # Seconds one call to the provider may take before it is tried again.
    timeout: float = 10.0


# The GB 45438 code an operator has not set yet: a placeholder of 0s (warned).
PLACEHOLDER_PRODUCER: Final = "0" * 27
# Label values (GB 45438 Annex E): printable ASCII without space, '"' or '\\'.
_LABEL_CODE: Final = re.compile(r"^[!#-\[\]-~]{1,64}$")


@dataclass(frozen=True, slots=True)
class LabelsSettings:
    """AI labels (CONTRACT §10): who made a work, and the keys that prove it."""

    producer_code: str = PLACEHOLDER_PRODUCER
    propagator_code: str = PLACEHOLDER_PRODUCER
    # PEM files of the C2PA signing chain (leaf first) and its key; None: no C2PA.
    c2pa_cert: Path | None = None
    c2pa_key: Path | None = None
    # STUDIO_SECRET_KEY and the key it replaced: ReservedCode1's HMAC keys.
    secret_key: str = field(default="", repr=False)
    secret_key_previous: str = field(default="", repr=False)


@dataclass(frozen=True, slots=True)
class WorkbenchSettings:
    """Generations, media and workers (CONTRACT §6, §7)."""

    demo_upstream: bool
    demo_seconds: float
    media_dir: Path
    media_public_url: str
    jobs_per_user: int
    visibility_timeout: int
    image_deadline: int
    video_deadline: int
    worker_concurrency: int
    expire_months: int
    hide_after_reports: int
    # Seconds a square read waits for Redis before serving its last good copy.
    square_read_budget: float
    # [upstreams.NAME] sections, by name.
    upstreams: dict[str, UpstreamSettings] = field(default_factory=dict, hash=False)
    # The bucket media live in; None: the directory media_dir.
    media_s3: MediaS3Settings | None = None
    # Credits of the daily grant (CONTRACT §12), a `bonus` lot for 7 days.
    daily_credits: int = 10
    # The workers log upstreams' refusals too.
    moderation: ModerationSettings = ModerationSettings()
    labels: LabelsSettings = LabelsSettings()


@dataclass(frozen=True, slots=True)
class AlipaySettings:
    """One Alipay app (CONTRACT §8): complete, or the channel is off."""

    app_id: str
    private_key: str = field(repr=False)
    public_key: str = field(repr=False)
    gateway: str
    seller_id: str


@dataclass(frozen=True, slots=True)
class WechatPaySettings:
    """One WeChat Pay APIv3 merchant (CONTRACT §8): complete, or the channel is off."""

    mchid: str
    appid: str
    serial: str
    private_key: str = field(repr=False)
    apiv3_key: str = field(repr=False)
    public_key: str = field(repr=False)
    public_key_id: str
    base_url: str


@dataclass(frozen=True, slots=True)
class PaymentsSettings:
    """Buying credits (CONTRACT §8): the channels and how orders are followed."""

    order_minutes: int
    fake: bool
    alipay: AlipaySettings | None
    wechatpay: WechatPaySettings | None
    # How often a worker asks the providers about orders still `created`, and
    # how old an order must be before it is asked about (no notice yet).
    reconcile_seconds: float
    reconcile_after: float
    # Where this process reaches the fake provider's gateway to query and refund
    # ("" = base_url); a worker in another container names the app here.
    fake_gateway_url: str = ""


@dataclass(frozen=True, slots=True)
class AccountSettings:
    """My account (CONTRACT §9): the grace period of a deletion and the purge job."""

    # Days between "delete my account" and its purge; signing in before restores.
    grace_days: int = 7
    # Seconds between a worker's looks for accounts whose purge is due.
    purge_seconds: float = 60.0


@dataclass(frozen=True, slots=True)
class Settings:
    base_url: str
    host: str
    port: int
    redis_url: str
    secret_key: str = field(repr=False)
    # The key STUDIO_SECRET_KEY replaced: addresses filed under it are still found.
    secret_key_previous: str = field(repr=False)
    trusted_proxies: tuple[IPNetwork, ...]
    contact_email: str
    mail_from: str
    trial_credits: int
    data_dir: Path
    smtp: SmtpSettings
    workbench: WorkbenchSettings
    payments: PaymentsSettings
    limits: dict[str, Policy] = field(hash=False)
    access_log: bool = True
    metrics_host: str = "127.0.0.1"
    metrics_port: int = 0
    # Redis Cluster (redis_cluster or a redis+cluster:// URL) and the replicas
    # a money-moving script waits for (WAIT) before it is acknowledged.
    redis_cluster: bool = False
    redis_wait_replicas: int = 0
    account: AccountSettings = AccountSettings()
    # The operator's content directory, replacing the packaged content/ as a
    # whole (service/content.py checks it); None: the packaged one.
    content_dir: Path | None = None

    @property
    def https(self) -> bool:
        """Tell whether the public origin is https (Secure cookies, HSTS)."""
        return self.base_url.startswith("https://")


def variable(dotted: str) -> str:
    """Name the environment variable of a dotted setting key."""
    return ENV_PREFIX + dotted.replace(".", "_").upper()


def load_settings(
    environ: Mapping[str, str] | None = None, defaults: Path = DEFAULT_CONFIG
) -> Settings:
    """Merge the default file, the optional overlay and STUDIO_* variables."""
    env = os.environ if environ is None else environ
    raw = _flatten(_read_toml(defaults, "defaults"))
    if overlay := env.get(OVERLAY_VARIABLE):
        for key, value in _flatten(_read_toml(Path(overlay), OVERLAY_VARIABLE)).items():
            if key not in raw and not _upstream_key(key):
                raise SettingsError(f"{OVERLAY_VARIABLE}: unknown setting {key!r}")
            raw[key] = value
    known = {variable(key): key for key in raw}
    for name, value in env.items():
        if not name.startswith(ENV_PREFIX) or name == OVERLAY_VARIABLE:
            continue
        dotted = known.get(name) or _upstream_variable(name)
        if dotted is None:
            raise SettingsError(f"{name}: unknown setting")
        raw[dotted] = value
    return _build(raw)


def _read_toml(path: Path, label: str) -> dict[str, Any]:
    try:
        with path.open("rb") as file:
            return tomllib.load(file)
    except OSError as err:
        raise SettingsError(f"{label}: cannot read {path}: {err.strerror}") from err
    except tomllib.TOMLDecodeError as err:
        raise SettingsError(f"{label}: {path} is not valid TOML: {err}") from err
    except UnicodeDecodeError as err:  # TOML is UTF-8
        raise SettingsError(
            f"{label}: {path} is not UTF-8 (byte {err.start})"
        ) from None


def _flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, Mapping):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[prefix + key] = value
    return flat


def _build(raw: Mapping[str, Any]) -> Settings:
    base_url = _base_url(raw["base_url"])
    host_name = _split("base_url", base_url).hostname or "localhost"
    tls = _text(raw, "smtp.tls").lower()
    if tls not in ("off", "starttls", "tls"):
        raise SettingsError(f"{variable('smtp.tls')}: must be off, starttls or tls")
    secret_key = _secret(raw, "secret_key")
    secret_key_previous = _secret(raw, "secret_key_previous")
    return Settings(
        base_url=base_url,
        host=_text(raw, "host") or "127.0.0.1",
        port=_integer(raw, "port", 1, 65535),
        redis_url=_redis_url(raw),
        secret_key=secret_key,
        secret_key_previous=secret_key_previous,
        trusted_proxies=_networks(raw),
        contact_email=_email(raw, "contact_email"),
        mail_from=_email(raw, "mail_from") or f"no-reply@{host_name}",
        trial_credits=_integer(raw, "trial_credits", 0, 1_000_000),
        data_dir=Path(_text(raw, "data_dir") or ".data").absolute(),
        smtp=SmtpSettings(
            host=_text(raw, "smtp.host"),
            port=_integer(raw, "smtp.port", 1, 65535),
            tls=cast(SmtpTls, tls),
            username=_text(raw, "smtp.username"),
            password=_text(raw, "smtp.password"),
            timeout=_number(raw, "smtp.timeout", 0.1, 300.0),
        ),
        workbench=WorkbenchSettings(
            demo_upstream=_boolean(raw, "demo.upstream"),
            demo_seconds=_number(raw, "demo.seconds", 0.0, 600.0),
            media_dir=Path(_text(raw, "media.dir") or ".data/media").absolute(),
            media_public_url=_public_url(raw, "media.public_url"),
            media_s3=_media_s3(raw),
            jobs_per_user=_integer(raw, "jobs.per_user", 1, 1000),
            visibility_timeout=_integer(raw, "jobs.visibility_timeout", 2, 86400),
            image_deadline=_integer(raw, "jobs.image_deadline", 1, 86400),
            video_deadline=_integer(raw, "jobs.video_deadline", 1, 86400),
            worker_concurrency=_integer(raw, "worker.concurrency", 1, 1000),
            expire_months=_integer(raw, "credits.expire_months", 1, 1200),
            daily_credits=_integer(raw, "credits.daily", 1, 1_000_000),
            hide_after_reports=_integer(raw, "square.hide_after_reports", 1, 1000),
            square_read_budget=_number(raw, "square.read_budget", 0.01, 5.0),
            upstreams=_upstreams(raw),
            moderation=_moderation(raw),
            labels=_labels(raw, secret_key, secret_key_previous),
        ),
        payments=_payments(raw),
        limits=_policies(raw),
        access_log=_on_off(raw, "access_log"),
        metrics_host=_text(raw, "metrics.host") or "127.0.0.1",
        metrics_port=_integer(raw, "metrics.port", 0, 65535),
        redis_cluster=_boolean(raw, "redis_cluster")
        or _text(raw, "redis_url").startswith(CLUSTER_SCHEMES),
        redis_wait_replicas=_integer(raw, "redis_wait_replicas", 0, 16),
        account=AccountSettings(
            grace_days=_integer(raw, "account.grace_days", 0, 365),
            purge_seconds=_number(raw, "account.purge_seconds", 0.1, 86400.0),
        ),
        content_dir=_directory(raw, "content_dir"),
    )


def _moderation(raw: Mapping[str, Any]) -> ModerationSettings:
    provider = _text(raw, "moderation.provider").lower() or "none"
    if provider not in MODERATION_PROVIDERS:
        names = ", ".join(MODERATION_PROVIDERS)
        raise SettingsError(
            f"{variable('moderation.provider')}: must be one of {names}"
        )
    key_id = _text(raw, "moderation.access_key_id")
    secret = _text(raw, "moderation.access_key_secret")
    if provider != "none" and not (key_id and secret):
        raise SettingsError(
            f"{variable('moderation.access_key_id')} and"
            f" {variable('moderation.access_key_secret')}: required by {provider}"
        )
    endpoint = _text(raw, "moderation.endpoint")
    if endpoint and not endpoint.startswith(("https://", "http://")):
        raise SettingsError(f"{variable('moderation.endpoint')}: must be a URL")
    app_id = _text(raw, "moderation.app_id")
    if provider == "volcengine" and not app_id.isdigit():
        raise SettingsError(
            f"{variable('moderation.app_id')}: Volcengine's application id (a number)"
        )
    region = _text(raw, "moderation.region")
    if region and not re.fullmatch(r"[a-z0-9-]{1,40}", region):
        raise SettingsError(
            f"{variable('moderation.region')}: a region name such as cn-shanghai"
        )
    return ModerationSettings(
        log_days=_integer(raw, "moderation.log_days", 180, 3650),
        reload_seconds=_number(raw, "moderation.reload_seconds", 0.1, 60.0),
        provider=provider,
        access_key_id=key_id,
        access_key_secret=secret,
        region=region,
        app_id=app_id,
        biz_type=_text(raw, "moderation.biz_type"),
        endpoint=endpoint,
        timeout=_number(raw, "moderation.timeout", 0.1, 120.0),
    )


def _labels(raw: Mapping[str, Any], secret: str, previous: str) -> LabelsSettings:
    """Read the label codes and the C2PA files (both files or neither)."""
    codes = {}
    for key in ("labels.producer_code", "labels.propagator_code"):
        code = _text(raw, key)
        if code and not _LABEL_CODE.match(code):
            raise SettingsError(
                f'{variable(key)}: 1-64 printable ASCII characters, no space, " or \\'
            )
        codes[key] = code
    producer = codes["labels.producer_code"] or PLACEHOLDER_PRODUCER
    cert, private = _file(raw, "labels.c2pa_cert"), _file(raw, "labels.c2pa_key")
    if (cert is None) != (private is None):
        raise SettingsError(
            f"{variable('labels.c2pa_cert')}, {variable('labels.c2pa_key')}:"
            " set both or neither"
        )
    return LabelsSettings(
        producer_code=producer,
        propagator_code=codes["labels.propagator_code"] or producer,
        c2pa_cert=cert,
        c2pa_key=private,
        secret_key=secret,
        secret_key_previous=previous,
    )


def _file(raw: Mapping[str, Any], key: str) -> Path | None:
    """Return an existing file (absolute), or None when the setting is empty."""
    text = _text(raw, key)
    if not text:
        return None
    path = Path(text).absolute()
    if not path.is_file():
        raise SettingsError(f"{variable(key)}: {path} is not a file")
    return path


def _directory(raw: Mapping[str, Any], key: str) -> Path | None:
    """Return an existing directory (absolute), or None when the setting is empty."""
    text = _text(raw, key)
    if not text:
        return None
    path = Path(text).absolute()
    if not path.is_dir():
        raise SettingsError(f"{variable(key)}: {path} is not a directory")
    return path


def _upstream_key(key: str) -> bool:
    """Tell whether a dotted key names a field of some [upstreams.NAME]."""
    parts = key.split(".")
    return len(parts) == 3 and parts[0] == "upstreams" and parts[2] in UPSTREAM_FIELDS


def _upstream_variable(name: str) -> str | None:
    """Map STUDIO_UPSTREAMS_<NAME>_<FIELD> of any upstream name to its key."""
    prefix = variable("upstreams.")
    if not name.startswith(prefix):
        return None
    rest = name.removeprefix(prefix)
    for part in UPSTREAM_FIELDS:
        upstream, _, field_name = rest.rpartition("_" + part.upper())
        if upstream and not field_name and upstream.replace("_", "").isalnum():
            return f"upstreams.{upstream.lower()}.{part}"
    return None


def _upstreams(raw: Mapping[str, Any]) -> dict[str, UpstreamSettings]:
    """Read every [upstreams.NAME] (names from any of the sources)."""
    names = sorted({key.split(".")[1] for key in raw if _upstream_key(key)})
    upstreams = {}
    for name in names:
        prefix = f"upstreams.{name}"
        section = {
            f"{prefix}.{part}": raw.get(f"{prefix}.{part}", default)
            for part, default in UPSTREAM_FIELDS.items()
        }
        protocol = _text(section, f"{prefix}.protocol").lower()
        if protocol not in UPSTREAM_PROTOCOLS:
            raise SettingsError(
                f"{variable(prefix + '.protocol')}: must be one of"
                f" {', '.join(UPSTREAM_PROTOCOLS)}"
            )
        base_url = _text(section, f"{prefix}.base_url").rstrip("/")
        parts = _split(f"{prefix}.base_url", base_url)
        off = protocol in KEYLESS_PROTOCOLS and not base_url
        if (
            protocol != "demo"
            and not off
            and (parts.scheme not in ("http", "https") or not parts.hostname)
        ):
            raise SettingsError(
                f"{variable(prefix + '.base_url')}: must be an http:// or https:// URL"
            )
        if protocol == "openai" and parts.path.endswith("/v1"):
            raise SettingsError(
                f"{variable(prefix + '.base_url')}: leave out /v1 (the paths carry it)"
            )
        upstreams[name] = UpstreamSettings(
            name=name,
            protocol=cast(UpstreamProtocol, protocol),
            base_url=base_url,
            api_key=_text(section, f"{prefix}.api_key"),
            max_in_flight=_integer(section, f"{prefix}.max_in_flight", 0, 100_000),
            timeout=_number(section, f"{prefix}.timeout", 1.0, 3600.0),
        )
    return upstreams


def _split(key: str, url: str) -> SplitResult:
    """Split a URL setting; one that cannot be split names its setting."""
    try:
        parts = urlsplit(url)
    except ValueError as err:
        raise SettingsError(f"{variable(key)}: not a URL ({err})") from None
    return parts


def _text(raw: Mapping[str, Any], key: str) -> str:
    value = raw[key]
    if not isinstance(value, str):
        raise SettingsError(f"{variable(key)}: must be a string")
    return value.strip()


def _secret(raw: Mapping[str, Any], key: str) -> str:
    secret = _text(raw, key)
    if secret and len(secret) < 32:
        raise SettingsError(f"{variable(key)}: must be at least 32 characters")
    return secret


def _integer(raw: Mapping[str, Any], key: str, low: int, high: int) -> int:
    value = raw[key]
    number: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str):  # a variable; 2.5 is not 2, nor is [1] 1
        with contextlib.suppress(ValueError):
            number = int(value.strip())
    if number is None or not low <= number <= high:
        raise SettingsError(f"{variable(key)}: must be an integer {low}-{high}")
    return number


def _boolean(raw: Mapping[str, Any], key: str) -> bool:
    value = raw[key]
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off", ""):
        return False
    raise SettingsError(f"{variable(key)}: must be 1/true or 0/false")


def _on_off(raw: Mapping[str, Any], key: str) -> bool:
    try:
        return _boolean(raw, key)
    except SettingsError:
        raise SettingsError(f"{variable(key)}: must be on or off") from None


def _public_url(raw: Mapping[str, Any], key: str) -> str:
    url = _text(raw, key).rstrip("/")
    if url and _split(key, url).scheme not in ("http", "https"):
        raise SettingsError(f"{variable(key)}: must be an http:// or https:// URL")
    return url


# S3 bucket names: 3-63 lowercase letters, digits, dots and hyphens.
_BUCKET: Final = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


def _media_s3(raw: Mapping[str, Any]) -> MediaS3Settings | None:
    """Read the bucket settings: a bucket turns the S3 store on."""
    endpoint = _public_url(raw, "media.s3_endpoint")
    bucket = _text(raw, "media.s3_bucket")
    key_id = _text(raw, "media.s3_access_key_id")
    secret = _text(raw, "media.s3_secret_access_key")
    if not bucket:
        for name, value in (
            ("media.s3_endpoint", endpoint),
            ("media.s3_access_key_id", key_id),
            ("media.s3_secret_access_key", secret),
        ):
            if value:
                raise SettingsError(
                    f"{variable('media.s3_bucket')}: required when {variable(name)}"
                    " is set"
                )
        return None
    if not _BUCKET.fullmatch(bucket):
        raise SettingsError(
            f"{variable('media.s3_bucket')}: must be an S3 bucket name (3-63"
            " lowercase letters, digits, dots and hyphens)"
        )
    if bool(key_id) != bool(secret):
        given, missing = (
            ("media.s3_access_key_id", "media.s3_secret_access_key")
            if key_id
            else ("media.s3_secret_access_key", "media.s3_access_key_id")
        )
        raise SettingsError(
            f"{variable(missing)}: required when {variable(given)} is set"
        )
    return MediaS3Settings(
        endpoint=endpoint,
        bucket=bucket,
        region=_text(raw, "media.s3_region") or "us-east-1",
        access_key_id=key_id,
        secret_access_key=secret,
    )


def _number(raw: Mapping[str, Any], key: str, low: float, high: float) -> float:
    value = raw[key]
    number: float | None = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
    elif isinstance(value, str):
        with contextlib.suppress(ValueError):
            number = float(value.strip())
    if number is None or not low <= number <= high:
        raise SettingsError(f"{variable(key)}: must be a number {low}-{high}")
    return number


def _base_url(value: Any) -> str:
    name = variable("base_url")
    if not isinstance(value, str):
        raise SettingsError(f"{name}: must be a string")
    parts = _split("base_url", value.strip())
    try:
        parts.port  # noqa: B018  (raises on a malformed port)
    except ValueError as err:
        raise SettingsError(f"{name}: malformed port") from err
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise SettingsError(f"{name}: must be an http:// or https:// origin")
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username:
        raise SettingsError(f"{name}: must be an origin without path, query or user")
    return f"{parts.scheme}://{parts.netloc.lower()}"


def _redis_url(raw: Mapping[str, Any]) -> str:
    url = _text(raw, "redis_url")
    if url and _split("redis_url", url).scheme not in REDIS_SCHEMES:
        raise SettingsError(
            f"{variable('redis_url')}: must be a redis://, rediss://, unix:// or"
            " redis+cluster:// URL"
        )
    if _boolean(raw, "redis_cluster") and url.startswith("unix:"):
        raise SettingsError(f"{variable('redis_cluster')}: needs a TCP redis_url")
    return url


def _networks(raw: Mapping[str, Any]) -> tuple[IPNetwork, ...]:
    value = raw["trusted_proxies"]
    items = value if isinstance(value, list) else str(value).split(",")
    try:
        return tuple(
            ipaddress.ip_network(str(item).strip(), strict=False)
            for item in items
            if str(item).strip()
        )
    except ValueError as err:
        raise SettingsError(f"{variable('trusted_proxies')}: {err}") from err


def _email(raw: Mapping[str, Any], key: str) -> str:
    value = _text(raw, key)
    if not value:
        return ""
    try:
        return validate_email(value, check_deliverability=False).normalized
    except EmailNotValidError as err:
        raise SettingsError(f"{variable(key)}: {err}") from err


def _policies(raw: Mapping[str, Any]) -> dict[str, Policy]:
    names = sorted({key.split(".")[1] for key in raw if key.startswith("limits.")})
    policies = {}
    for name in names:
        numbers = {
            part: _integer(raw, f"limits.{name}.{part}", 1, 10**9)
            for part in ("quota", "window", "burst")
        }
        try:
            policy = Policy(name.replace("_", "-"), **numbers)
        except ValueError as err:
            raise SettingsError(f"{variable('limits.' + name)}_*: {err}") from err
        policies[policy.name] = policy
    return policies


_ALIPAY: Final = ("app_id", "private_key", "public_key")
_WECHATPAY: Final = (
    "mchid",
    "appid",
    "serial",
    "private_key",
    "apiv3_key",
    "public_key",
    "public_key_id",
)


def _payments(raw: Mapping[str, Any]) -> PaymentsSettings:
    return PaymentsSettings(
        order_minutes=_integer(raw, "payments.order_minutes", 1, 1440),
        fake=_boolean(raw, "payments.fake"),
        alipay=_alipay(raw),
        wechatpay=_wechatpay(raw),
        reconcile_seconds=_number(raw, "payments.reconcile_seconds", 0.1, 86400.0),
        reconcile_after=_number(raw, "payments.reconcile_after", 0.0, 86400.0),
        fake_gateway_url=_public_url(raw, "payments.fake_gateway_url"),
    )


def _channel(raw: Mapping[str, Any], prefix: str, names: tuple[str, ...]) -> bool:
    """Tell whether a channel is configured: all of its settings, or none."""
    given = [name for name in names if _text(raw, f"{prefix}.{name}")]
    if given and len(given) < len(names):
        missing = next(name for name in names if name not in given)
        raise SettingsError(
            f"{variable(f'{prefix}.{missing}')}: required when"
            f" {variable(f'{prefix}.{given[0]}')} is set"
        )
    return bool(given)


def _alipay(raw: Mapping[str, Any]) -> AlipaySettings | None:
    if not _channel(raw, "payments.alipay", _ALIPAY):
        return None
    return AlipaySettings(
        app_id=_text(raw, "payments.alipay.app_id"),
        private_key=_pem(raw, "payments.alipay.private_key", private=True),
        public_key=_pem(raw, "payments.alipay.public_key", private=False),
        gateway=_https_url(raw, "payments.alipay.gateway"),
        seller_id=_text(raw, "payments.alipay.seller_id"),
    )


def _wechatpay(raw: Mapping[str, Any]) -> WechatPaySettings | None:
    if not _channel(raw, "payments.wechatpay", _WECHATPAY):
        return None
    apiv3_key = _text(raw, "payments.wechatpay.apiv3_key")
    if len(apiv3_key.encode()) != 32:
        raise SettingsError(
            f"{variable('payments.wechatpay.apiv3_key')}: must be 32 characters"
        )
    return WechatPaySettings(
        mchid=_text(raw, "payments.wechatpay.mchid"),
        appid=_text(raw, "payments.wechatpay.appid"),
        serial=_text(raw, "payments.wechatpay.serial"),
        private_key=_pem(raw, "payments.wechatpay.private_key", private=True),
        apiv3_key=apiv3_key,
        public_key=_pem(raw, "payments.wechatpay.public_key", private=False),
        public_key_id=_text(raw, "payments.wechatpay.public_key_id"),
        base_url=_https_url(raw, "payments.wechatpay.base_url"),
    )


def _pem(raw: Mapping[str, Any], key: str, *, private: bool) -> str:
    """Return an RSA key's text once it is proven to load; never echo it.

    Variables cannot always hold line breaks, so a literal `\\n` stands for
    one; the bare base64 body the providers' consoles show is accepted too.
    """
    text = _text(raw, key).replace("\\n", "\n")
    # Here, not at the top: only a configured channel loads cryptography.
    from .payments.signing import BadKey, load_private_key, load_public_key

    try:
        (load_private_key if private else load_public_key)(text)
    except BadKey as err:
        raise SettingsError(f"{variable(key)}: {err}") from None
    return text


def _https_url(raw: Mapping[str, Any], key: str) -> str:
    url = _text(raw, key).rstrip("/")
    parts = _split(key, url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise SettingsError(f"{variable(key)}: must be an http:// or https:// URL")
    return url


def require_production(settings: Settings) -> None:
    """Refuse to serve without the settings that production cannot default."""
    if not settings.redis_url:
        raise SettingsError(f"{variable('redis_url')}: required by serve")
    if not settings.secret_key:
        raise SettingsError(f"{variable('secret_key')}: required by serve")
    refuse_fake_payments(settings)


def refuse_fake_payments(settings: Settings) -> None:
    """Keep the fake provider (anyone "pays" for nothing) away from real money.

    Only `make run`, the compose stack and the tests turn it on: all on an
    http:// base_url, without channel keys. `serve` and `worker` refuse more.
    """
    if not settings.payments.fake:
        return
    name = variable("payments.fake")
    if settings.https:
        raise SettingsError(
            f"{name}: a fake provider takes payments for nothing;"
            f" not with an https {variable('base_url')}"
        )
    if settings.payments.alipay or settings.payments.wechatpay:
        raise SettingsError(
            f"{name}: a fake provider takes payments for nothing;"
            " not with real channel keys (STUDIO_PAYMENTS_ALIPAY_*/WECHATPAY_*)"
        )
