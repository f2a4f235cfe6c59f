"""Importing user code named in a config: ``path/to/script.py:function`` and plugin modules.

Scripts are imported by path under a stable module name, so every worker imports them alike,
with their folder importable as ``python script.py`` would make it. A script whose file or
local imports changed is imported again, so a long-lived process never runs an old version.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from quantune.errors import QuantuneError
from quantune.userexit import Guarded
from quantune.userlocal import forget_stale_local_modules, local_imports, remember_local_modules, script_fingerprint

_PLUGIN_FILES: dict[str, None] = {}  # the plugin files this process imported, in order


def import_script(script: str, field_name: str, base_dir: Path) -> ModuleType:
    path = (base_dir / script).resolve()
    if not path.is_file():
        raise QuantuneError(f"{field_name}: no script at '{script}' (looked in {path.parent})")
    module_name = f"quantune_user_{hashlib.sha1(str(path).encode()).hexdigest()[:12]}"
    content = script_fingerprint(path)
    module = sys.modules.get(module_name)
    if module is not None and getattr(module, "__quantune_sha256__", content) == content:
        return module
    imports = local_imports(path)
    forget_stale_local_modules(imports)
    importlib.invalidate_caches()  # a helper written since the last import is found
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise QuantuneError(f"{field_name}: cannot import '{script}'")
    module = importlib.util.module_from_spec(spec)
    module.__quantune_sha256__ = content  # type: ignore[attr-defined]
    sys.modules[module_name] = module
    folder = str(path.parent)
    # its helpers import as beside ``python script.py``: its folder first while it loads, last
    # afterwards, so a user file named like a later quantune import never stands in for it
    was_at = sys.path.index(folder) if folder in sys.path else None
    if was_at is not None:
        del sys.path[was_at]
    sys.path.insert(0, folder)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[module_name]
        raise QuantuneError(f"{field_name}: importing '{script}' failed: {type(exc).__name__}: {exc}") from None
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(folder)
        if was_at is None:
            sys.path.append(folder)
        else:
            sys.path.insert(was_at, folder)
    remember_local_modules(imports)
    return module


def load_function(spec: str, field_name: str, base_dir: Path) -> Any:
    script, _, func_name = spec.rpartition(":")
    func = getattr(import_script(script, field_name, base_dir), func_name, None)
    if not callable(func):
        raise QuantuneError(f"{field_name}: '{script}' defines no function '{func_name}'")
    return Guarded(func, field_name, script)  # sys.exit() or os._exit() in it is named, not obeyed


def load_plugins(plugins: list[str], base_dir: Path) -> None:
    """Imports each plugin (a ``.py`` file or an importable module) so its passes, samplers and
    strategies register themselves."""
    for index, plugin in enumerate(plugins):
        field_name = f"plugins[{index}]"
        if plugin.endswith(".py"):
            _PLUGIN_FILES[str(import_script(plugin, field_name, base_dir).__file__)] = None
            continue
        try:
            importlib.import_module(plugin)
        except ImportError as exc:
            raise QuantuneError(f"{field_name}: cannot import module '{plugin}': {exc}") from None


def plugin_files() -> list[str]:
    """The plugin files this process imported, for a process it starts to import (:func:`load_plugins`)
    before it unpickles anything naming their classes: those live in modules named by the file's path."""
    return list(_PLUGIN_FILES)
