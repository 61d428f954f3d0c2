"""Keep the package's shape: no import circles, no upward imports, no private names.

Reads the layers from `[tool.check-imports]` in the root's pyproject.toml,
bottom first; each layer is one package or module, or several separated by
" | " that must not import each other. A module belongs to the longest entry
its name starts with. Every import counts: those under `if TYPE_CHECKING:`
and inside functions too, because a circle of type-only imports is still a
circle of knowledge, and the day one of them runs it is a real one. Importing
`a.b.c` also runs `a/__init__.py` and `a/b/__init__.py`, so those count as
imports of the packages (except the importer's own, which are already running).

Usage: python scripts/check_imports.py [ROOT]   (exit 1 and one line per problem)
"""

from __future__ import annotations

import ast
import sys
import tomllib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class Import:
    """One module importing another, and where it says so."""

    source: str
    target: str
    path: Path
    line: int
    names: tuple[str, ...]  # the names taken with `from target import ...`
    implied: bool = False  # a package's __init__ that the import runs first


@dataclass(frozen=True, slots=True)
class Rules:
    """The package to check and its layers, bottom first."""

    package: str
    layers: tuple[tuple[str, ...], ...]


def read_rules(root: Path) -> Rules:
    """Read `[tool.check-imports]` from the root's pyproject.toml."""
    config = tomllib.loads((root / "pyproject.toml").read_text())
    table = config["tool"]["check-imports"]
    layers = tuple(
        tuple(part.strip() for part in layer.split("|")) for layer in table["layers"]
    )
    return Rules(package=table["package"], layers=layers)


def find_modules(root: Path, package: str) -> dict[str, Path]:
    """Map every module name of the package to its file."""
    modules = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def _is_package(module: str, modules: Mapping[str, Path]) -> bool:
    return modules[module].name == "__init__.py"


def _resolve(module: str, node: ast.ImportFrom, modules: Mapping[str, Path]) -> str:
    """Return the absolute name of a `from ... import` statement's module."""
    if not node.level:
        return node.module or ""
    base = module if _is_package(module, modules) else module.rpartition(".")[0]
    for _ in range(node.level - 1):
        base = base.rpartition(".")[0]
    return f"{base}.{node.module}" if node.module else base


def _ancestors(module: str) -> set[str]:
    parts = module.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts) + 1)}


def _named(
    module: str, node: ast.Import | ast.ImportFrom, modules: Mapping[str, Path]
) -> list[tuple[str, tuple[str, ...]]]:
    """Return the modules one statement names, each with the names taken from it."""
    if isinstance(node, ast.Import):
        return [(alias.name, ()) for alias in node.names]
    base = _resolve(module, node, modules)
    found: list[tuple[str, tuple[str, ...]]] = []
    plain = []
    for alias in node.names:
        if f"{base}.{alias.name}" in modules:  # a submodule, not a name
            found.append((f"{base}.{alias.name}", ()))
        else:
            plain.append(alias.name)
    if plain or not found:
        found.append((base, tuple(plain)))
    return found


def imports_of(
    module: str, path: Path, modules: Mapping[str, Path]
) -> Iterator[Import]:
    """Yield every import of a module that lands inside the package."""
    tree = ast.parse(path.read_text(), str(path))
    running = _ancestors(_home(module, modules))  # already importing: no new run
    for node in ast.walk(tree):
        if not isinstance(node, ast.Import | ast.ImportFrom):
            continue
        for name, names in _named(module, node, modules):
            target = name
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if not target or target == module:
                continue
            yield Import(module, target, path, node.lineno, names)
            for package in sorted(_ancestors(target) - running - {target}):
                if package in modules:
                    yield Import(module, package, path, node.lineno, (), implied=True)


def _strongly_connected(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """Return the graph's strongly connected components (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for succ in edges:
                if succ not in index:
                    index[succ] = low[succ] = len(index)
                    stack.append(succ)
                    on_stack.add(succ)
                    work.append((succ, iter(sorted(graph[succ]))))
                    break
                if succ in on_stack:
                    low[node] = min(low[node], index[succ])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    components.append(sorted(component))
    return components


def _cycle_in(component: Sequence[str], graph: Mapping[str, set[str]]) -> list[str]:
    """Return one closed path through a component, from its first module."""
    members = set(component)
    start = component[0]
    paths = {start: [start]}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for succ in sorted(graph[node] & members):
            if succ == start:
                return [*paths[node], start]
            if succ not in paths:
                paths[succ] = [*paths[node], succ]
                queue.append(succ)
    return [start, start]


def layer_of(module: str, rules: Rules) -> tuple[int, str] | None:
    """Return a module's layer (its index, bottom 0) and its entry in it."""
    matches = [
        (number, entry)
        for number, layer in enumerate(rules.layers)
        for entry in layer
        if module == entry or module.startswith(entry + ".")
    ]
    return max(matches, key=lambda match: len(match[1]), default=None)


def _home(module: str, modules: Mapping[str, Path]) -> str:
    """Return the package a module belongs to (a package belongs to itself)."""
    return module if _is_package(module, modules) else module.rpartition(".")[0]


def circles(found: Sequence[Import], modules: Mapping[str, Path]) -> list[str]:
    """Describe every import circle: one path through it and all its modules."""
    graph: dict[str, set[str]] = {module: set() for module in modules}
    for edge in found:
        graph[edge.source].add(edge.target)
    return [
        f"import circle of {len(component)} modules: "
        f"{' -> '.join(_cycle_in(component, graph))}"
        f" (all of it: {', '.join(component)})"
        for component in _strongly_connected(graph)
        if len(component) > 1
    ]


def upward(edge: Import, rules: Rules) -> str | None:
    """Describe an import of a higher layer, or of an independent neighbour."""
    source, target = layer_of(edge.source, rules), layer_of(edge.target, rules)
    if edge.implied or not source or not target or source[1] == target[1]:
        return None
    if target[0] > source[0]:
        return (
            f"upward import: {edge.source} ({source[1]}) imports"
            f" {edge.target} ({target[1]}, a higher layer)"
        )
    if target[0] == source[0]:
        return (
            f"{edge.source} ({source[1]}) imports {edge.target}"
            f" ({target[1]}), independent in the same layer"
        )
    return None


def private(edge: Import, modules: Mapping[str, Path]) -> list[str]:
    """Describe each `_name` (or `_module`) taken from another package."""
    if edge.implied or _home(edge.source, modules) == _home(edge.target, modules):
        return []
    hidden = [n for n in edge.names if n.startswith("_") and not n.endswith("__")]
    last = edge.target.rpartition(".")[2]
    if last.startswith("_") and not last.endswith("__"):
        hidden.insert(0, f"module {edge.target}")
    return [
        f"private name {name} of {edge.target} imported"
        f" from another package ({edge.source})"
        for name in hidden
    ]


def check(root: Path) -> list[str]:
    """Return one line per problem in the root's package (none: the shape holds)."""
    rules = read_rules(root)
    modules = find_modules(root, rules.package)
    found = [
        edge
        for module, path in modules.items()
        for edge in imports_of(module, path, modules)
    ]
    problems = circles(found, modules)
    problems += [
        f"{modules[module].relative_to(root)}: {module} is in no layer"
        for module in modules
        if module != rules.package and layer_of(module, rules) is None
    ]
    for edge in found:
        where = f"{edge.path.relative_to(root)}:{edge.line}"
        if (wrong := upward(edge, rules)) is not None:
            problems.append(f"{where}: {wrong}")
        problems += [f"{where}: {wrong}" for wrong in private(edge, modules)]
    return sorted(set(problems))


def main(argv: Sequence[str]) -> int:
    """Check the tree at argv[0] (default: the current directory)."""
    root = Path(argv[0]) if argv else Path()
    problems = check(root)
    for problem in problems:
        print(problem)
    if problems:
        print(f"check_imports: {len(problems)} problem(s)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
