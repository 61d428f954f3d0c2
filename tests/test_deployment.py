"""compose.yaml and the Dockerfile, checked without a Docker engine."""

from __future__ import annotations

import ipaddress
import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from service.settings import ROOT, load_settings, require_production

SCHEMAS = Path(__file__).parent / "schemas"


def _compose() -> dict[str, Any]:
    document = yaml.safe_load((ROOT / "compose.yaml").read_text())
    assert isinstance(document, dict)
    return document


# What an operator would export for the variables compose requires (${NAME:?…}).
REQUIRED_VALUE = "compose-test-secret-0123456789-abcdefghij"


def _expand(value: str) -> str:
    """Apply compose's ${NAME:-default} and ${NAME:?message} interpolation.

    Nothing is set, except that a required variable gets `REQUIRED_VALUE`.
    """
    value = re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", value)
    return re.sub(r"\$\{[A-Z_]+:\?[^}]*\}", REQUIRED_VALUE, value)


def _ports(service: dict[str, Any]) -> list[str]:
    return [str(port) for port in service.get("ports", [])]


def test_compose_file_is_valid_against_the_compose_spec() -> None:
    """The official JSON schema accepts compose.yaml."""
    schema = json.loads((SCHEMAS / "compose-spec.json").read_text())
    validator_class = jsonschema.validators.validator_for(schema)
    validator_class.check_schema(schema)
    errors = list(validator_class(schema).iter_errors(_compose()))
    assert not errors, [error.message for error in errors]


def test_compose_runs_app_valkey_with_aof_and_mailpit() -> None:
    """The services; Redis persists with AOF; the app waits for it to be healthy."""
    services = _compose()["services"]
    assert services["app"]["deploy"]["replicas"] == 2
    assert set(services) == {"proxy", "app", "worker", "redis", "s3", "mailpit"}
    assert services["worker"]["command"] == ["python", "-m", "service", "worker"]
    # The worker shares the app's settings, and reaches the fake provider via the proxy.
    assert services["worker"]["environment"] == {
        **services["app"]["environment"],
        "STUDIO_PAYMENTS_FAKE_GATEWAY_URL": "http://proxy:8080",
    }
    assert services["worker"].get("volumes") == services["app"].get("volumes")
    assert "--appendonly" in services["redis"]["command"]
    assert (
        services["redis"]["command"][
            services["redis"]["command"].index("--appendonly") + 1
        ]
        == "yes"
    )
    assert services["redis"]["volumes"]
    assert services["app"]["depends_on"]["redis"]["condition"] == "service_healthy"
    assert set(_ports(services["mailpit"])) == {
        "127.0.0.1:8025:8025",
        "127.0.0.1:1025:1025",
    }


def test_compose_publishes_only_the_proxy_and_only_on_loopback() -> None:
    """Clients reach nginx (deploy/nginx.conf), never the app; nothing listens wide."""
    services = _compose()["services"]
    proxy = services["proxy"]
    assert proxy["image"].startswith("nginx:")
    assert _ports(proxy) == ["127.0.0.1:8080:8080"]
    assert "./deploy/nginx.conf:/etc/nginx/nginx.conf:ro" in proxy["volumes"]
    assert (ROOT / "deploy" / "nginx.conf").is_file()
    assert proxy["depends_on"]["app"]["condition"] == "service_healthy"
    for name in ("app", "worker", "redis", "s3"):
        assert not _ports(services[name]), name
    for name, service in services.items():
        assert all(port.startswith("127.0.0.1:") for port in _ports(service)), name
    config = (ROOT / "deploy" / "nginx.conf").read_text()
    assert "server app:8080;" in config
    assert "listen 8080;" in config


def test_compose_keeps_media_in_its_s3_service_with_the_apps_credentials() -> None:
    """App and worker keep media in SeaweedFS (`weed mini`), on its volume."""
    services = _compose()["services"]
    s3, environment = services["s3"], services["app"]["environment"]
    assert s3["image"].startswith("chrislusf/seaweedfs:")
    command = s3["command"]
    assert command[0] == "mini"
    assert "-master.telemetry=false" in command
    assert f"-bucket={environment['STUDIO_MEDIA_S3_BUCKET']}" in command
    assert s3["environment"] == {
        "AWS_ACCESS_KEY_ID": environment["STUDIO_MEDIA_S3_ACCESS_KEY_ID"],
        "AWS_SECRET_ACCESS_KEY": environment["STUDIO_MEDIA_S3_SECRET_ACCESS_KEY"],
    }
    assert environment["STUDIO_MEDIA_S3_ENDPOINT"] == "http://s3:8333"
    assert any(volume.endswith(":/data") for volume in s3["volumes"])
    assert "8333" in " ".join(s3["healthcheck"]["test"])
    for name in ("app", "worker"):
        assert services[name]["depends_on"]["s3"]["condition"] == "service_healthy"


def test_compose_has_no_default_secret() -> None:
    """`up` refuses to start until the operator sets STUDIO_SECRET_KEY."""
    environment = _compose()["services"]["app"]["environment"]
    secret = str(environment["STUDIO_SECRET_KEY"])
    assert re.fullmatch(r"\$\{STUDIO_SECRET_KEY:\?[^}]+\}", secret), secret
    assert not any(":-" in str(value) for value in environment.values())


def test_compose_app_trusts_the_proxy_network_it_defines() -> None:
    """The app honours X-Forwarded-For from the stack's own network, nothing wider."""
    document = _compose()
    environment = document["services"]["app"]["environment"]
    trusted = ipaddress.ip_network(environment["STUDIO_TRUSTED_PROXIES"])
    subnets = [
        ipaddress.ip_network(entry["subnet"])
        for entry in document["networks"]["default"]["ipam"]["config"]
    ]
    assert trusted in subnets
    assert trusted.is_private


def test_compose_environment_is_a_valid_production_configuration() -> None:
    """Every STUDIO_* variable the app gets is known and valid."""
    environment = {
        k: _expand(str(v))
        for k, v in _compose()["services"]["app"]["environment"].items()
    }
    settings = load_settings(environment)
    assert settings.redis_url == "redis://redis:6379/0"
    assert settings.smtp.host == "mailpit"
    assert settings.smtp.port == 1025
    assert settings.host == "0.0.0.0"
    assert settings.secret_key == REQUIRED_VALUE
    assert settings.workbench.demo_upstream
    assert settings.workbench.media_s3 is not None
    assert settings.workbench.media_s3.bucket == "media"
    assert [str(net) for net in settings.trusted_proxies] == ["172.30.57.0/24"]
    # serve starts on it: the fake provider is on, on an http:// base_url
    assert settings.payments.fake
    require_production(settings)


def test_dockerfile_is_slim_non_root_and_checks_healthz() -> None:
    """The image runs `serve` as an unprivileged user, with a health check."""
    lines = [line.strip() for line in (ROOT / "Dockerfile").read_text().splitlines()]
    images = [line.split()[1] for line in lines if line.startswith("FROM ")]
    assert images
    assert all(image.endswith("-slim") for image in images)
    users = [line.split()[1] for line in lines if line.startswith("USER ")]
    assert users
    assert users[-1] not in ("root", "0")
    healthcheck = " ".join(
        lines[
            next(i for i, line in enumerate(lines) if line.startswith("HEALTHCHECK")) :
        ]
    )
    assert "/healthz" in healthcheck
    assert lines[-1] == 'CMD ["python", "-m", "service", "serve"]'


def _stages() -> list[list[str]]:
    """Split the Dockerfile into its stages, each a list of stripped lines."""
    stages: list[list[str]] = []
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        if line.startswith("FROM "):
            stages.append([])
        if stages and line.strip() and not line.startswith("#"):
            stages[-1].append(line.strip())
    return stages


def test_dockerfile_builds_a_wheel_and_runs_only_the_installed_package() -> None:
    """Multi-stage: the wheel is built from the package; the image installs it alone."""
    build, runtime = _stages()
    assert build[0].startswith("FROM python:3.11-slim AS ")
    builder = build[0].split()[-1]
    assert "COPY service ./service" in build
    assert any(line.startswith("RUN pip wheel --no-deps") for line in build)
    assert runtime[0] == "FROM python:3.11-slim"
    assert any(line.startswith(f"COPY --from={builder} /wheels") for line in runtime)
    assert any(
        line.startswith("&& pip install --no-deps /wheels/")
        and line.endswith(".whl \\")
        for line in runtime
    )
    # No source tree in the runtime image: every COPY there comes from the build.
    copies = [line for line in runtime if line.startswith(("COPY ", "ADD "))]
    assert copies
    assert all(line.startswith("COPY --from=") for line in copies)
    assert not any("pip install -e" in line for line in build + runtime)
