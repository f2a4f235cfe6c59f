"""quantune's import graph as floors and arrows: which imports point up, and which modules import in a circle.

The house (DESIGN.md) has floors, and imports should point down: the CLI and the Python API
on top, the model handle at the bottom. This reads every ``import`` statement of
``src/quantune`` (with :mod:`ast`, nothing is imported), puts each module on its floor
(``FLOORS``, defined once here; tests/test_architecture.py reuses it), and prints:

* the modules and imports per floor;
* every import from a lower floor to a higher one ("upward"), with the list;
* the import cycles: strongly connected components of the module graph with more than one
  module (every import counts, deferred ones inside functions and ``TYPE_CHECKING`` ones too:
  each is an arrow a reader has to follow);
* the cycles between the parts of a package: inside each package, every subpackage taken as one
  node beside the package's own modules (a subpackage that imports a sibling which imports it
  back is one room split in two, even when no module imports in a circle).

An import of a package counts as an import of its ``__init__`` (``from quantune.passes import
get_pass`` is an arrow to ``quantune.passes``); ``from quantune.evaluate import latency``
(a submodule) is an arrow to the submodule. Run from the repository root::

    python bench/import_graph.py            # the table
    python bench/import_graph.py --markdown # the same, for bench/results/
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "quantune"

# Floors from the top (imports may point down or stay on a floor), the layering the code has and
# DESIGN.md's spirit: the CLI and API on top; the report reads results for the CLI; the engine
# (its executors with it: they run the engine's trials) drives strategies and samplers, which
# read the config's options; passes are the tools preparation and the engine run; the space,
# the store, the evaluation, the data and the model handle below; leaf helpers at the bottom.
# The longest prefix wins (``quantune.engine.executors`` is on the engine's floor).
FLOORS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("cli/api", ("quantune", "quantune.cli", "quantune.api", "quantune.__main__", "quantune.starter")),
    ("report", ("quantune.report",)),
    ("engine", ("quantune.engine", "quantune.convert")),
    ("strategy/search", ("quantune.strategy", "quantune.search")),
    ("config", ("quantune.config",)),
    ("passes", ("quantune.passes",)),
    ("prepare", ("quantune.prepare",)),
    ("space", ("quantune.space",)),
    ("store", ("quantune.store",)),
    ("evaluate", ("quantune.evaluate",)),
    ("data", ("quantune.data",)),
    ("model", ("quantune.model", "quantune.memory", "quantune.machine", "quantune.graph")),
    (
        "base",
        (
            "quantune.errors",
            "quantune._version",
            "quantune.registry",
            "quantune.wording",
            "quantune.userimport",
            "quantune.userexit",
            "quantune.userlocal",
            "quantune.userfault",
            "quantune._lazy",
            "quantune.forkserver",
            "quantune.progress",
        ),
    ),
)


@dataclass(frozen=True)
class Arrow:
    source: str  # importing module
    target: str  # imported module
    line: int


def module_name(path: Path, src: Path = SRC) -> str:
    parts = list(path.relative_to(src).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules(src: Path = SRC) -> dict[str, Path]:
    """Module name -> file, for every module of the package."""
    return {
        module_name(path, src): path
        for path in sorted((src / PACKAGE).rglob("*.py"))
        if "__pycache__" not in path.parts
    }


def arrows(src: Path = SRC) -> list[Arrow]:
    """Every import of a quantune module by a quantune module (one arrow per imported module per statement)."""
    known = modules(src)
    found: list[Arrow] = []
    for name, path in known.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _absolute(node, name, is_package)
                # ``from package import submodule`` imports the submodule; other names come from the package
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
            else:
                continue
            for target in dict.fromkeys(targets):
                resolved = _known(target, known)
                if resolved is not None and resolved != name:
                    found.append(Arrow(name, resolved, node.lineno))
    return found


def _absolute(node: ast.ImportFrom, importer: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    parts = importer.split(".")
    if not is_package:
        parts.pop()
    parts = parts[: len(parts) - (node.level - 1)]
    return ".".join([*parts, *([node.module] if node.module else [])])


def _known(target: str, known: dict[str, Path]) -> str | None:
    """The quantune module ``target`` names (its longest known prefix), or None for other packages."""
    parts = target.split(".")
    while parts and parts[0] == PACKAGE:
        candidate = ".".join(parts)
        if candidate in known:
            return candidate
        parts.pop()
    return None


def floor_of(module: str) -> int:
    """The floor index (0 = top) of ``module``: the floor of its longest matching prefix."""
    best, best_len = None, -1
    for index, (_, prefixes) in enumerate(FLOORS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best_len:
                best, best_len = index, len(prefix)
    if best is None:
        raise ValueError(f"{module} is on no floor: add its prefix to FLOORS in bench/import_graph.py")
    return best


def upward(found: Iterable[Arrow]) -> list[Arrow]:
    """Imports from a lower floor to a higher one."""
    return sorted((a for a in found if floor_of(a.source) > floor_of(a.target)), key=lambda a: (a.source, a.line))


def cycles(found: Iterable[Arrow]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm), sorted."""
    graph: dict[str, set[str]] = defaultdict(set)
    for arrow in found:
        graph[arrow.source].add(arrow.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    counter = 0

    def visit(start: str) -> None:  # iterative: the module graph is deep enough for recursion limits to matter
        nonlocal counter
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
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
                if len(component) > 1:
                    components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(components)


def package_cycles(found: Iterable[Arrow], src: Path = SRC) -> list[list[str]]:
    """The cycles among each package's parts (its modules, and its subpackages each as one node)."""
    found = list(found)
    circles: list[list[str]] = []
    for package in sorted(name for name, path in modules(src).items() if path.name == "__init__.py"):
        inside = package + "."
        parts = [
            Arrow(_part(package, a.source), _part(package, a.target), a.line)
            for a in found
            if a.source.startswith(inside)
            and a.target.startswith(inside)
            and _part(package, a.source) != _part(package, a.target)
        ]
        circles += cycles(parts)
    return circles


def _part(package: str, module: str) -> str:
    """The part of ``package`` that holds ``module``: the module itself, or the subpackage it is in."""
    return f"{package}.{module[len(package) + 1 :].split('.')[0]}"


def figures(src: Path = SRC) -> dict[str, object]:
    """The summary the architecture test compares: upward imports and cycles (and their lists)."""
    found = arrows(src)
    up = upward(found)
    circles = cycles(found)
    rooms = package_cycles(found, src)
    return {
        "modules": len(modules(src)),
        "imports": len(found),
        "upward": up,
        "cycles": circles,
        "package_cycles": rooms,
    }


def report(src: Path = SRC, markdown: bool = False) -> str:
    known = modules(src)
    found = arrows(src)
    up = upward(found)
    circles = cycles(found)
    rooms = package_cycles(found, src)
    per_floor: dict[int, list[str]] = defaultdict(list)
    for name in known:
        per_floor[floor_of(name)].append(name)
    out_arrows: dict[int, int] = defaultdict(int)
    up_from: dict[int, int] = defaultdict(int)
    for arrow in found:
        out_arrows[floor_of(arrow.source)] += 1
    for arrow in up:
        up_from[floor_of(arrow.source)] += 1
    lines = [
        "| floor | prefixes | modules | imports out | upward out |",
        "|---|---|---:|---:|---:|",
    ]
    for index, (floor, prefixes) in enumerate(FLOORS):
        lines.append(
            f"| {index} {floor} | {', '.join(prefixes)} | {len(per_floor[index])} | {out_arrows[index]} | {up_from[index]} |"
        )
    lines += [
        "",
        f"modules {len(known)}, imports between them {len(found)}, "
        f"upward imports {len(up)}, import cycles {len(circles)}, cycles between a package's parts {len(rooms)}",
        "",
        "Upward imports (importer:line -> imported, floors):",
    ]
    lines += [
        f"- {a.source}:{a.line} -> {a.target} ({FLOORS[floor_of(a.source)][0]} -> {FLOORS[floor_of(a.target)][0]})"
        for a in up
    ] or ["- none"]
    lines += ["", "Import cycles (strongly connected components):"]
    lines += [f"- {' <-> '.join(c)}" for c in circles] or ["- none"]
    lines += ["", "Cycles between a package's parts (a subpackage as one node):"]
    lines += [f"- {' <-> '.join(c)}" for c in rooms] or ["- none"]
    text = "\n".join(lines)
    return text if markdown else text.replace("| ", " ").replace(" |", " ")


if __name__ == "__main__":
    print(report(markdown="--markdown" in sys.argv[1:]))
