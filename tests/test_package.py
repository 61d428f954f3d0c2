"""The wheel alone is the service: installed anywhere, it serves with no checkout."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tomllib
import urllib.request
import zipfile
from pathlib import Path

import pytest

from service.content import CONTENT_DIR
from service.settings import DEFAULT_CONFIG, PACKAGE, ROOT
from service.store.embedded import RedisServer
from service.web.setup import TEMPLATES_DIR

from .conftest import TEST_SECRET
from .ports import free_port
from .processes import studio_environ, wait_until_healthy


def _run(*command: str | Path, cwd: Path) -> None:
    result = subprocess.run(
        [str(part) for part in command],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _dockerfile_sources() -> list[str]:
    """Name what the Dockerfile's build stage copies from the checkout."""
    names: list[str] = []
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        if line.startswith("FROM ") and names:
            break
        if line.startswith("COPY ") and "--from=" not in line:
            names += line.split()[1:-1]
    return names


def _mapped_dirs() -> dict[str, str]:
    """Return pyproject.toml's package-dir: package name -> checkout directory."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    mapping: dict[str, str] = project["tool"]["setuptools"]["package-dir"]
    return mapping


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Build the wheel offline from a copy of what the Dockerfile copies."""
    work = tmp_path_factory.mktemp("wheel")
    source = work / "source"
    source.mkdir()
    # A copy, so the build's scratch (build/, *.egg-info) stays out of the checkout.
    for name in _dockerfile_sources():
        if (ROOT / name).is_dir():
            shutil.copytree(
                ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__")
            )
        else:
            shutil.copy(ROOT / name, source / name)
    dist = work / "dist"
    _run(
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--quiet",
        "--no-deps",
        "--no-build-isolation",
        "--no-index",
        "--wheel-dir",
        dist,
        source,
        cwd=work,
    )
    (built,) = dist.glob("studio_service-*.whl")
    return built


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the wheel installed; its dependencies come from ours."""
    root = tmp_path_factory.mktemp("venv") / "venv"
    _run(sys.executable, "-m", "venv", "--without-pip", root, cwd=root.parent)
    python = root / "bin" / "python"
    # The wheel goes in first, while the new venv sees nothing else.
    _run(
        sys.executable,
        "-m",
        "pip",
        "--python",
        python,
        "install",
        "--quiet",
        "--no-deps",
        "--no-index",
        wheel,
        cwd=root.parent,
    )
    # Then the dependencies, offline: this venv's site-packages as a plain path
    # entry (its .pth files, the editable install of the checkout among them,
    # are not run), after the new venv's own.
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (Path(purelib) / "dependencies.pth").write_text(
        sysconfig.get_paths()["purelib"] + "\n"
    )
    return root


def test_the_wheel_carries_every_file_the_package_reads(wheel: Path) -> None:
    """Config, content, templates, static files and Lua scripts are all inside."""
    names = set(zipfile.ZipFile(wheel).namelist())
    wanted = {
        package.replace(".", "/") + "/" + path.relative_to(ROOT / folder).as_posix()
        for package, folder in _mapped_dirs().items()
        for path in (ROOT / folder).rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }
    assert wanted - names == set()
    assert {
        "service/__main__.py",
        "service/config/default.toml",
        "service/content/site.toml",
        "service/content/models.toml",
        "service/templates/base.html",
        "service/static/studio/app.js",
        "service/limits/lua/gcra.lua",
    } <= names


def test_the_checkout_keeps_config_content_and_templates_at_the_top_level() -> None:
    """The checkout reads its top-level copies, and has no stale one in the package."""
    mapped = {
        package.removeprefix("service."): folder
        for package, folder in _mapped_dirs().items()
        if package != "service"
    }
    assert mapped == {
        "config": "config",
        "content": "content",
        "templates": "templates",
    }
    for name in mapped:
        assert not (PACKAGE / name).exists(), name
    assert DEFAULT_CONFIG == ROOT / "config" / "default.toml"
    assert CONTENT_DIR == ROOT / "content"
    assert TEMPLATES_DIR == ROOT / "templates"


def test_the_installed_wheel_reads_its_packaged_copies(
    venv: Path, tmp_path: Path
) -> None:
    """Installed, config, content and templates come from inside the package."""
    isolated = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    script = (
        "from service.web.setup import TEMPLATES_DIR; from service.content import"
        " CONTENT_DIR; from service.settings import DEFAULT_CONFIG, PACKAGE;"
        " print(PACKAGE); print(DEFAULT_CONFIG); print(CONTENT_DIR);"
        " print(TEMPLATES_DIR)"
    )
    lines = subprocess.run(
        [venv / "bin" / "python", "-c", script],
        cwd=tmp_path,
        env=isolated,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    package = Path(lines[0])
    assert package.is_relative_to(venv), package
    assert [Path(line) for line in lines[1:]] == [
        package / "config" / "default.toml",
        package / "content",
        package / "templates",
    ]


def test_the_installed_wheel_serves_from_an_empty_directory(
    venv: Path, redis_server: RedisServer, tmp_path: Path
) -> None:
    """`studio serve` from the venv, in an empty directory, answers the public files."""
    python = venv / "bin" / "python"
    # Nothing of the checkout may leak in: no PYTHONPATH (the soak script sets one).
    isolated = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    where = subprocess.run(
        [python, "-c", "import service; print(service.__file__)"],
        cwd=tmp_path,
        env=isolated,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert Path(where).is_relative_to(venv), where
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    environ = studio_environ(
        PYTHONPATH="",
        STUDIO_PORT=str(port),
        STUDIO_BASE_URL=base_url,
        STUDIO_REDIS_URL=redis_server.url,
        STUDIO_SECRET_KEY=TEST_SECRET,
        STUDIO_ACCESS_LOG="off",
    )
    process = subprocess.Popen(
        [venv / "bin" / "studio", "serve"],
        cwd=tmp_path,
        env=environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_until_healthy(base_url, process, timeout=20)
        for path in ("/", "/robots.txt", "/api/models"):
            with urllib.request.urlopen(base_url + path, timeout=5) as response:
                assert response.status == 200, path
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=15) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        assert process.stdout
        process.stdout.close()
