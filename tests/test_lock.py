"""requirements.lock pins and hashes what the image installs, for every target."""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
from dataclasses import dataclass, field
from typing import cast

import pytest
from packaging.markers import Marker, default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from service.settings import ROOT

LOCK = ROOT / "requirements.lock"
_HASH = re.compile(r"^--hash=sha256:[0-9a-f]{64}$")
# The image's base (python:3.11-slim) on both architectures, and the next Python.
TARGETS = [
    {
        "platform_machine": machine,
        "python_version": version,
        "python_full_version": full,
    }
    for machine in ("x86_64", "aarch64")
    for version, full in (("3.11", "3.11.14"), ("3.12", "3.12.12"))
]


@dataclass
class Pin:
    """One line of the lock: a name, its version, where it applies, its hashes."""

    name: str
    version: Version
    marker: Marker | None
    hashes: list[str] = field(default_factory=list)


def _pins() -> list[Pin]:
    pins: list[Pin] = []
    for line in LOCK.read_text().splitlines():
        text = line.strip().removesuffix("\\").strip()
        if not text or text.startswith("#"):
            continue
        if line[0].isspace():
            pins[-1].hashes.append(text)
            continue
        requirement, _, marker = text.partition(";")
        name, _, version = requirement.strip().partition("==")
        pins.append(
            Pin(
                canonicalize_name(name),
                Version(version),
                Marker(marker) if marker.strip() else None,
            )
        )
    return pins


def _environment(target: dict[str, str]) -> dict[str, str]:
    here = cast(dict[str, str], default_environment())
    return {**here, "sys_platform": "linux", **target}


def _applying(environment: dict[str, str]) -> dict[str, Pin]:
    pins = [
        pin for pin in _pins() if pin.marker is None or pin.marker.evaluate(environment)
    ]
    by_name = {pin.name: pin for pin in pins}
    assert len(by_name) == len(pins), "one version of each package per target"
    return by_name


def _runtime() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return [Requirement(line) for line in project["dependencies"]]


def test_every_pin_carries_sha256_hashes() -> None:
    """--require-hashes refuses a pin without one; each line has its own."""
    pins = _pins()
    assert len(pins) > 20
    for pin in pins:
        assert pin.hashes, pin.name
        assert all(_HASH.match(digest) for digest in pin.hashes), pin.name


@pytest.mark.parametrize(
    "target", TARGETS, ids=lambda t: f"{t['platform_machine']}-{t['python_version']}"
)
def test_the_lock_satisfies_every_runtime_dependency(target: dict[str, str]) -> None:
    """Each dependency of pyproject.toml is pinned within its range on each target."""
    environment = _environment(target)
    pins = _applying(environment)
    for requirement in _runtime():
        if requirement.marker and not requirement.marker.evaluate(environment):
            continue
        pin = pins.get(canonicalize_name(requirement.name))
        assert pin, f"{requirement.name} is not locked: run `make lock`"
        assert requirement.specifier.contains(pin.version, prereleases=True), (
            f"{pin.name}=={pin.version} is outside {requirement}: run `make lock`"
        )


def test_the_lock_closes_over_what_the_locked_versions_require() -> None:
    """Everything an installed, locked dependency needs is locked too (this Python)."""
    environment = _environment({})
    pins = _applying(environment)
    todo = [canonicalize_name(r.name) for r in _runtime()]
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        assert name in pins, f"{name} is needed but not locked: run `make lock`"
        try:
            installed = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        if Version(installed.version) != pins[name].version:
            continue  # another version here: its needs say nothing of the pin's
        for line in installed.requires or []:
            needed = Requirement(line)
            if needed.marker and not needed.marker.evaluate(
                {**environment, "extra": ""}
            ):
                continue
            todo.append(canonicalize_name(needed.name))
    assert seen <= set(pins)


def test_the_image_installs_the_lock_with_hashes_then_the_wheel_alone() -> None:
    """The Dockerfile checks every hash, takes only wheels, and adds nothing else."""
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "COPY pyproject.toml README.md requirements.lock ./" in dockerfile
    install = re.search(r"RUN pip install (.*?) -r (\S+)", dockerfile)
    assert install, "the runtime stage installs from the lock"
    assert install.group(2) == "/wheels/requirements.lock"
    assert {"--require-hashes", "--only-binary=:all:"} <= set(install.group(1).split())
    assert "pip install --no-deps /wheels/*.whl" in dockerfile
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^lock:", makefile, re.MULTILINE)
    assert "--generate-hashes" in makefile
    assert "--output-file requirements.lock" in makefile
