"""The modules a user script imports from its own folder, and a fingerprint that covers them.

A changed helper must count as a changed metric, or a resume mixes old and new scores. Imports
are read from the source (not watched), so every process gets the same answer before anything
runs; loaded modules are remembered with their hash, so a stale helper is dropped on re-import.
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import importlib.util
import sys
from pathlib import Path

_REMEMBERED: dict[str, tuple[Path, str]] = {}  # module name -> (file, sha256) loaded from a user's folder


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _resolve(root: Path, name: str) -> Path | None:
    """The file in ``root`` that ``import name`` finds there, or None (a namespace folder, or not local)."""
    base = root.joinpath(*name.split("."))
    for candidate in (base.with_name(base.name + ".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate.resolve()
    return None


def _imported_names(path: Path, module: str) -> set[str]:
    """Every module name ``path`` (imported as ``module``) may import, and its parent packages."""
    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except (SyntaxError, ValueError, OSError):
        return set()  # importing it reports the error
    is_package = path.name == "__init__.py"
    package = module if is_package else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".") if package else []
                if node.level - 1 > len(parts) or not package:
                    continue
                base = ".".join(parts[: len(parts) - (node.level - 1)])
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            if not target:
                continue
            names.add(target)
            names.update(f"{target}.{alias.name}" for alias in node.names if alias.name != "*")
    expanded = set()
    for name in names:
        parts = name.split(".")
        expanded.update(".".join(parts[: i + 1]) for i in range(len(parts)))
    return expanded


def local_imports(script: Path) -> dict[str, Path]:
    """``module name -> file`` for each module ``script`` imports from its folder, transitively."""
    root = script.resolve().parent
    found: dict[str, Path] = {}
    pending = [(script.resolve(), "")]
    while pending:
        path, module = pending.pop()
        for name in sorted(_imported_names(path, module)):
            if name in found:
                continue
            file = _resolve(root, name)
            if file is None or file == script.resolve():
                continue
            found[name] = file
            pending.append((file, name))
    return dict(sorted(found.items()))


def script_fingerprint(script: Path) -> str:
    """sha256 of the script's bytes; with local imports, of those and every imported file's bytes."""
    own = _sha256(script)
    imports = local_imports(script)
    if not imports:
        return own  # the same fingerprint as before helpers counted: older runs still resume
    digest = hashlib.sha256(own.encode())
    root = script.resolve().parent
    for name, file in imports.items():
        digest.update(f"|{name}|{file.relative_to(root)}|{_sha256(file)}".encode())
    return digest.hexdigest()


def forget_stale_local_modules(imports: dict[str, Path]) -> None:
    """Drops from ``sys.modules`` each remembered user module the script imports, and each whose file changed."""
    for name, (file, sha) in list(_REMEMBERED.items()):
        try:
            stale = name in imports or _sha256(file) != sha
        except OSError:
            stale = True
        if stale:
            sys.modules.pop(name, None)
            del _REMEMBERED[name]
            # bytecode is checked by mtime in whole seconds and size: a same-second edit would load old code
            with contextlib.suppress(OSError, ValueError, NotImplementedError):
                Path(importlib.util.cache_from_source(str(file))).unlink(missing_ok=True)


def remember_local_modules(imports: dict[str, Path]) -> None:
    """Remembers which of ``imports`` were loaded from their local file, with its hash now."""
    for name, file in imports.items():
        module = sys.modules.get(name)
        origin = getattr(module, "__file__", None)
        if origin and Path(origin).resolve() == file:
            _REMEMBERED[name] = (file, _sha256(file))
