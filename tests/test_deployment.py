"""compose.yaml and the Dockerfile, checked without a Docker engine."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import jsonschema
import yaml

from service.labels.finish import read_labels
from service.settings import ROOT, load_settings, require_production
from service.store.embedded import MailCatcher, RedisServer

from .conftest import TEST_SECRET, latest_code
from .processes import running, studio_environ
from .workbench import new_address, worker_process

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


def _image_level() -> str:
    """The PYTHONOPTIMIZE the runtime image sets for every process it runs."""
    _, runtime = _stages()
    (level,) = (
        line.split("=", 1)[1]
        for line in runtime
        if line.startswith("ENV PYTHONOPTIMIZE=")
    )
    return level


def test_the_image_compiles_its_bytecode_for_the_level_it_runs_at() -> None:
    """Its base image ships the standard library without bytecode and nothing may
    write any at run time, so the build compiles all of it, at the image's level,
    before that level is set."""
    _, runtime = _stages()
    level = _image_level()
    assert level == "2"
    assert "ENV PYTHONDONTWRITEBYTECODE=1 \\" in runtime
    compiles = next(
        i for i, line in enumerate(runtime) if "python -m compileall" in line
    )
    assert f"-o {level} /usr/local/lib/python3.11" in runtime[compiles]
    setting = runtime.index(f"ENV PYTHONOPTIMIZE={level}")
    assert compiles < setting


def test_help_keeps_its_description_at_the_images_level() -> None:
    """`studio --help` says what it is without docstrings (PYTHONOPTIMIZE=2)."""
    done = subprocess.run(
        [sys.executable, "-m", "service", "--help"],
        cwd=ROOT,
        env=studio_environ(PYTHONOPTIMIZE=_image_level()),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert "`serve` for production" in done.stdout


async def _signed_in(base: str, mail: MailCatcher) -> aiohttp.ClientSession:
    session = aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True))
    email = new_address()
    async with session.post(f"{base}/api/auth/code", json={"email": email}) as r:
        assert r.status == 200, await r.text()
    code = latest_code(mail, email)
    body = {"email": email, "code": code}
    async with session.post(f"{base}/api/auth/verify", json=body) as r:
        assert r.status == 200, await r.text()
    return session


async def test_serve_and_a_worker_at_the_images_level_make_a_labeled_work(
    redis_server: RedisServer, mail_server: MailCatcher, tmp_path: Path
) -> None:
    """Without docstrings or asserts, as the image runs them, a demo generation
    goes from the submit to a stored picture that carries its TC260 label."""
    variables = {
        "PYTHONOPTIMIZE": _image_level(),
        "STUDIO_REDIS_URL": redis_server.url,
        "STUDIO_SECRET_KEY": TEST_SECRET,
        "STUDIO_SMTP_HOST": mail_server.host,
        "STUDIO_SMTP_PORT": str(mail_server.port),
        "STUDIO_DEMO_UPSTREAM": "1",
        "STUDIO_DEMO_SECONDS": "0",
        "STUDIO_MEDIA_DIR": str(tmp_path / "media"),
    }
    # No bytecode for this level may be there yet: each process compiles it.
    with (
        running("serve", variables, timeout=60) as (base, _),
        worker_process(variables),
    ):
        session = await _signed_in(base, mail_server)
        async with session:
            body = {"model": "seedream-4", "prompt": "a lamp on a desk", "seed": 3}
            async with session.post(f"{base}/api/generations", json=body) as r:
                assert r.status == 202, await r.text()
                gid = (await r.json())["id"]
            deadline = time.monotonic() + 60
            while True:
                async with session.get(f"{base}/api/generations/{gid}") as r:
                    generation = await r.json()
                if generation["status"] == "succeeded":
                    break
                assert generation["status"] in {"queued", "running"}, generation
                assert time.monotonic() < deadline, "the generation never succeeded"
                await asyncio.sleep(0.1)
            (work,) = generation["works"]
            async with session.get(base + work["media_url"]) as r:
                assert r.status == 200
                picture = await r.read()
    label = read_labels(picture, "png").parsed()
    assert label is not None
    assert label["ProduceID"] == work["id"]
