"""scripts/check_imports.py: circles, upward and private imports fail the build."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

ROOT: Final = Path(__file__).resolve().parent.parent
CHECKER: Final = ROOT / "scripts" / "check_imports.py"
LAYERS: Final = ("pkg.low", "pkg.mid | pkg.side", "pkg.high")


def plant(root: Path, files: Mapping[str, str], layers: Sequence[str] = LAYERS) -> Path:
    """Write a package `pkg` of these modules, and a pyproject.toml of its layers."""
    listed = ", ".join(f'"{layer}"' for layer in layers)
    (root / "pyproject.toml").write_text(
        f'[tool.check-imports]\npackage = "pkg"\nlayers = [{listed}]\n'
    )
    inits = ("pkg", "pkg/low", "pkg/mid", "pkg/side", "pkg/high")
    files = {f"{package}/__init__.py": "" for package in inits} | dict(files)
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


def check(root: Path) -> subprocess.CompletedProcess[str]:
    """Run the checker on a tree as `make lint` does."""
    return subprocess.run(
        [sys.executable, str(CHECKER), str(root)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_real_tree_has_no_circle_upward_or_private_import() -> None:
    """The service as it is passes, with nothing printed."""
    result = check(ROOT)
    assert (result.returncode, result.stdout) == (0, "")


def test_a_layered_package_without_problems_passes(tmp_path: Path) -> None:
    """Downward imports, and private names inside one package, are fine."""
    root = plant(
        tmp_path,
        {
            "pkg/low/base.py": "_CACHE = {}\nVALUE = 1\n",
            "pkg/low/more.py": "from .base import _CACHE, VALUE\n",
            "pkg/mid/use.py": "from ..low.base import VALUE\n",
            "pkg/high/top.py": "from pkg.mid import use\nfrom ..low import more\n",
        },
    )
    result = check(root)
    assert (result.returncode, result.stdout) == (0, "")


def test_a_circle_of_type_checking_imports_fails(tmp_path: Path) -> None:
    """A circle counts even when one side only imports under TYPE_CHECKING."""
    root = plant(
        tmp_path,
        {
            "pkg/low/a.py": """
                from typing import TYPE_CHECKING
                if TYPE_CHECKING:
                    from .b import B
            """,
            "pkg/low/b.py": "from pkg.low.c import C\nB = 1\n",
            "pkg/low/c.py": "def f():\n    from . import a\nC = 1\n",
        },
    )
    result = check(root)
    assert result.returncode == 1
    assert result.stdout.splitlines() == [
        "import circle of 3 modules: pkg.low.a -> pkg.low.b -> pkg.low.c -> pkg.low.a"
        " (all of it: pkg.low.a, pkg.low.b, pkg.low.c)"
    ]


def test_an_import_from_a_higher_layer_fails(tmp_path: Path) -> None:
    """A lower layer importing an upper one is named with its file and line."""
    root = plant(
        tmp_path,
        {
            "pkg/high/store.py": "class Store: ...\n",
            "pkg/low/keys.py": "import os\nfrom ..high.store import Store\n",
        },
    )
    result = check(root)
    assert result.returncode == 1
    assert result.stdout.splitlines() == [
        "pkg/low/keys.py:2: upward import: pkg.low.keys (pkg.low) imports"
        " pkg.high.store (pkg.high, a higher layer)"
    ]


def test_neighbours_in_one_layer_stay_independent(tmp_path: Path) -> None:
    """Packages listed side by side (" | ") may not import each other."""
    root = plant(
        tmp_path, {"pkg/mid/a.py": "from pkg.side import b\n", "pkg/side/b.py": ""}
    )
    result = check(root)
    assert result.returncode == 1
    assert result.stdout.splitlines() == [
        "pkg/mid/a.py:1: pkg.mid.a (pkg.mid) imports pkg.side.b (pkg.side),"
        " independent in the same layer"
    ]


def test_a_private_name_from_another_package_fails(tmp_path: Path) -> None:
    """Reaching into another package's `_name` fails, even downward."""
    root = plant(
        tmp_path,
        {
            "pkg/low/works.py": '_HIDDEN = "hidden"\n',
            "pkg/high/deletion.py": "from ..low.works import _HIDDEN\n",
        },
    )
    result = check(root)
    assert result.returncode == 1
    assert result.stdout.splitlines() == [
        "pkg/high/deletion.py:1: private name _HIDDEN of pkg.low.works imported"
        " from another package (pkg.high.deletion)"
    ]


def test_a_package_init_that_imports_back_up_closes_a_circle(tmp_path: Path) -> None:
    """Importing pkg.high.keys runs pkg/high/__init__.py first: an import too."""
    root = plant(
        tmp_path,
        {
            "pkg/high/__init__.py": "from .setup import setup\n",
            "pkg/high/setup.py": "from ..low.routes import ROUTES\ndef setup(): ...\n",
            "pkg/high/keys.py": "KEY = 1\n",
            "pkg/low/routes.py": "from pkg.high.keys import KEY\nROUTES = [KEY]\n",
        },
    )
    lines = check(root).stdout.splitlines()
    assert lines == [
        "import circle of 3 modules: pkg.high -> pkg.high.setup -> pkg.low.routes"
        " -> pkg.high (all of it: pkg.high, pkg.high.setup, pkg.low.routes)",
        "pkg/low/routes.py:1: upward import: pkg.low.routes (pkg.low) imports"
        " pkg.high.keys (pkg.high, a higher layer)",
    ]


def test_a_module_outside_every_layer_fails(tmp_path: Path) -> None:
    """A new package has to be given its place before it can be imported."""
    root = plant(tmp_path, {"pkg/extra/__init__.py": "", "pkg/extra/thing.py": ""})
    result = check(root)
    assert result.returncode == 1
    assert result.stdout.splitlines() == [
        "pkg/extra/__init__.py: pkg.extra is in no layer",
        "pkg/extra/thing.py: pkg.extra.thing is in no layer",
    ]
