"""compose.yaml and the Dockerfile, checked without a Docker engine."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from service.settings import ROOT, load_settings

SCHEMAS = Path(__file__).parent / "schemas"


def _compose() -> dict[str, Any]:
    document = yaml.safe_load((ROOT / "compose.yaml").read_text())
    assert isinstance(document, dict)
    return document


def _expand(value: str) -> str:
    """Apply compose's ${NAME:-default} interpolation with nothing set."""
    return re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", value)


def test_compose_file_is_valid_against_the_compose_spec() -> None:
    """The official JSON schema accepts compose.yaml."""
    schema = json.loads((SCHEMAS / "compose-spec.json").read_text())
    validator_class = jsonschema.validators.validator_for(schema)
    validator_class.check_schema(schema)
    errors = list(validator_class(schema).iter_errors(_compose()))
    assert not errors, [error.message for error in errors]


def test_compose_runs_app_valkey_with_aof_and_mailpit() -> None:
    """Three services; Redis persists with AOF; the app waits for it to be healthy."""
    services = _compose()["services"]
    assert set(services) == {"app", "worker", "redis", "mailpit"}
    assert services["worker"]["command"] == ["python", "-m", "service", "worker"]
    assert services["worker"]["environment"] == services["app"]["environment"]
    assert services["worker"]["volumes"] == services["app"]["volumes"]
    assert "--appendonly" in services["redis"]["command"]
    assert (
        services["redis"]["command"][
            services["redis"]["command"].index("--appendonly") + 1
        ]
        == "yes"
    )
    assert services["redis"]["volumes"]
    assert services["app"]["depends_on"]["redis"]["condition"] == "service_healthy"
    assert "8080:8080" in services["app"]["ports"]
    assert {"8025:8025", "1025:1025"} <= set(services["mailpit"]["ports"])


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
    assert len(settings.secret_key) >= 32
    assert settings.workbench.demo_upstream


def test_dockerfile_is_slim_non_root_and_checks_healthz() -> None:
    """The image runs `serve` as an unprivileged user, with a health check."""
    lines = [line.strip() for line in (ROOT / "Dockerfile").read_text().splitlines()]
    assert lines[
        next(i for i, line in enumerate(lines) if line.startswith("FROM"))
    ].endswith("-slim")
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
    for directory in ("service", "config", "content", "templates"):
        assert any(line.startswith(f"COPY {directory} ") for line in lines), directory
