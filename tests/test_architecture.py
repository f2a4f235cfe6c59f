"""The house rules a newcomer relies on, checked on the source tree itself.

Small modules (one job each, under 400 lines), the engine never reaching up into the report,
and strategies that get facts from the engine instead of reading files or running models.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).parents[1] / "src" / "quantune"


def _modules(under: Path) -> list[Path]:
    return sorted(path for path in under.rglob("*.py") if "__pycache__" not in path.parts)


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def test_no_module_is_over_400_lines():
    long = {str(p.relative_to(SRC)): n for p in _modules(SRC) if (n := len(p.read_text().splitlines())) > 400}
    assert not long, f"split by job: {long}"


def test_the_engine_never_imports_the_report():
    reaching_up = {
        str(p.relative_to(SRC)): sorted(m for m in _imports(p) if m.startswith("quantune.report"))
        for p in _modules(SRC / "engine")
    }
    assert not {k: v for k, v in reaching_up.items() if v}


def test_strategies_touch_no_files_and_run_no_models():
    """Strategies get the model's capability, sensitivity and timings as functions from the engine."""
    offenders = {}
    for path in _modules(SRC / "strategy"):
        tree = ast.parse(path.read_text())
        calls = {
            ast.unparse(node.func)
            for node in ast.walk(tree)
            if isinstance(node, ast.Call) and ast.unparse(node.func) in {"open", "Path", "onnx.load", "from_model"}
        }
        calls |= {m for m in _imports(path) if m in {"onnxruntime", "onnx", "pathlib", "quantune.engine"}}
        calls |= {m for m in _imports(path) if m.startswith("quantune.engine.")}
        if calls:
            offenders[str(path.relative_to(SRC))] = sorted(calls)
    assert not offenders


def _import_graph():
    """bench/import_graph.py, the one definition of the floors (loaded by path: bench is no package)."""
    import importlib.util
    import sys

    path = Path(__file__).parents[1] / "bench" / "import_graph.py"
    spec = importlib.util.spec_from_file_location("quantune_bench_import_graph", path)
    assert spec is not None and spec.loader is not None
    module = sys.modules.setdefault(spec.name, importlib.util.module_from_spec(spec))
    spec.loader.exec_module(module)
    return module


# The figures the import graph may not grow past (bench/results/import-graph-*.md): imports from a
# lower floor to a higher one, and import cycles. Lower them when an arrow is fixed.
# bench/results/import-graph-2026-11-27-thin.md: the sensitivity probe is the engine's, capability/head quantune.graph
MAX_UPWARD_IMPORTS = 0
MAX_IMPORT_CYCLES = 0  # sections reads the wording from quantune.wording, not report.result
MAX_PACKAGE_CYCLES = 0  # the engine by job: run, outcome, measure, executors, trials, plan, each on those after it


def test_imports_point_down_and_go_round_no_more_than_before():
    graph = _import_graph()
    found = graph.arrows(SRC.parent)
    upward = [f"{a.source}:{a.line} -> {a.target}" for a in graph.upward(found)]
    cycles = graph.cycles(found)
    assert len(upward) <= MAX_UPWARD_IMPORTS, "imports that point up a floor (FLOORS in bench/import_graph.py):\n" + (
        "\n".join(upward)
    )
    assert len(cycles) <= MAX_IMPORT_CYCLES, f"import cycles: {cycles}"
    rooms = graph.package_cycles(found, SRC.parent)
    assert len(rooms) <= MAX_PACKAGE_CYCLES, f"subpackages that import each other: {rooms}"


# Strings that name a precision (``"fp16"`` is a pass and a dtype): a literal holding one of these
# beside a pass name is a list of precisions, not of passes.
_PRECISIONS = {"fp32", "bf16", "int4", "int8", "uint8", "int16", "uint16", "float32", "float16"}


def test_no_list_of_pass_names_outside_the_passes():
    """What the house needs to know about a pass is its traits (passes/base.py), so a new pass is
    one file: a list, set, tuple or dict of pass names outside ``passes/`` is a list someone
    would have to find and extend."""
    from quantune.passes import pass_names

    names = set(pass_names())
    offenders = []
    for path in _modules(SRC):
        if (SRC / "passes") in path.parents:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.List | ast.Set | ast.Tuple):
                items = list(node.elts)
            elif isinstance(node, ast.Dict):
                items = [*(k for k in node.keys if k is not None), *node.values]
            else:
                continue
            strings = {item.value for item in items if isinstance(item, ast.Constant) and isinstance(item.value, str)}
            if strings & names and not strings & _PRECISIONS:
                offenders.append(f"{path.relative_to(SRC)}:{node.lineno}: {sorted(strings & names)}")
    assert not offenders, "read the passes' traits instead:\n" + "\n".join(offenders)


# Where a pass or quantizer parameter may be spelled outside passes/, and why: the config schema's
# descriptions and the configs ``quantune init`` writes are for users, who name passes; a pass
# named like a precision (``fp16``) cannot be told from the precision in a string; ``bits`` is
# also an ONNX node attribute the report reads.
_MAY_NAME = {"config/schema.py": None, "starter/init.py": None, "report/precision.py": {"bits"}}


def _docstrings(tree: ast.AST) -> set[int]:
    kinds = ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef
    return {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, kinds) and node.body and isinstance(node.body[0], ast.Expr)
    }


def test_no_pass_or_quantizer_parameter_named_outside_the_passes():
    """The house knows a pass by its traits and a quantizer's parameters by its ``knobs``, so a
    second quantizer whose parameters are named otherwise gets the same ceilings, fallback and
    recovery: no string in code outside ``passes/`` (any literal, f-strings' parts too; docstrings
    explain and are left out) holds a registered pass's name or a quantizing pass's parameter name."""
    import re

    from quantune.passes.registry import PASSES

    passes = PASSES.registered()
    names = set(passes) | {field for cls in passes.values() if cls.quantizes for field in cls.Config.model_fields}
    names -= {"fp16"}  # a precision too
    assert {"static_quant", "nodes_to_exclude", "quant_format"} <= names  # the registry was read
    spelled = re.compile(r"(?<!\w)(" + "|".join(map(re.escape, sorted(names, key=len, reverse=True))) + r")(?!\w)")
    offenders = []
    for path in _modules(SRC):
        where = str(path.relative_to(SRC))
        if (SRC / "passes") in path.parents or (where in _MAY_NAME and _MAY_NAME[where] is None):
            continue
        tree = ast.parse(path.read_text())
        docs = _docstrings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
                found = set(spelled.findall(node.value)) - (_MAY_NAME.get(where) or set())
                if found:
                    offenders.append(f"{where}:{node.lineno}: {sorted(found)}")
    assert not offenders, "read the passes' traits (Pass.role, Pass.knobs, ...) instead:\n" + "\n".join(offenders)


def test_no_module_imports_another_modules_private_names():
    """A ``_name`` is its module's own: another module that needs it gets a public name."""
    offenders = [
        f"{path.relative_to(SRC)}:{node.lineno}: {alias.name}"
        for path in _modules(SRC)
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("quantune")
        for alias in node.names
        if alias.name.startswith("_") and not alias.name.startswith("__")
    ]
    assert not offenders


def test_the_engine_is_by_job_and_each_room_names_its_public_names():
    """The engine's modules live in its subpackages (none loose beside them), and each subpackage's
    lazily exported names resolve to objects of its own modules."""
    import importlib

    assert [p.name for p in (SRC / "engine").glob("*.py")] == ["__init__.py"]
    for init in sorted((SRC / "engine").glob("*/__init__.py")):
        package = importlib.import_module(f"quantune.engine.{init.parent.name}")
        assert package.__all__, package.__name__
        for name in package.__all__:
            assert getattr(package, name).__module__.startswith(package.__name__ + "."), (package.__name__, name)
