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
