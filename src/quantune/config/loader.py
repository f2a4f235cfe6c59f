"""Loading a config from a path, dict or object, turning every problem into a ConfigError."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from quantune.config.overrides import apply_overrides, blame
from quantune.config.schema import Config
from quantune.errors import ConfigError


@dataclass(frozen=True)
class LoadedConfig:
    """A validated config plus the folder its relative paths are relative to."""

    config: Config
    base_dir: Path
    source: str

    def resolve(self, path: str) -> Path:
        return (self.base_dir / path).expanduser().resolve()

    def runtime_env(self) -> dict[str, Any] | None:
        """``executor.runtime_env`` with its local ``working_dir`` and ``py_modules`` as absolute paths
        (relative ones are the config folder's, as every path of a config), links kept as named: Ray
        packs a folder through its links, and a script is found inside it by the path the config gives."""
        env = self.config.executor.runtime_env
        if env is None:
            return None
        env = dict(env)
        if isinstance(env.get("working_dir"), str) and is_local(env["working_dir"]):
            env["working_dir"] = self.absolute(env["working_dir"])
        if isinstance(env.get("py_modules"), list):
            env["py_modules"] = [self.absolute(entry) if is_local(entry) else entry for entry in env["py_modules"]]
        return env

    def absolute(self, path: str) -> str:
        """``path`` absolute (relative to the config's folder), its links not followed."""
        return os.path.abspath(self.base_dir / Path(path).expanduser())


def is_local(entry: str) -> bool:
    """A runtime_env entry that names a local path, not a URI (``gcs://...``, ``s3://...``)."""
    return "://" not in entry


def _check_runtime_env(loaded: LoadedConfig) -> None:
    """One line naming the field and the path for a local ``working_dir``/``py_modules`` entry that is
    not there: Ray would say it only once the cluster is up, in words that name neither."""
    given = loaded.config.executor.runtime_env or {}
    env = loaded.runtime_env() or {}
    where = [("working_dir", given.get("working_dir"), env.get("working_dir"))]
    where += [(f"py_modules[{i}]", entry, env["py_modules"][i]) for i, entry in enumerate(given.get("py_modules", []))]
    for field, entry, path in where:
        if isinstance(entry, str) and is_local(entry) and not os.path.exists(path):
            raise ConfigError(
                f"executor.runtime_env.{field}: nothing at '{entry}' (looked for {path})", source=loaded.source
            )


def load_config(
    config: str | Path | dict[str, Any] | Config | LoadedConfig,
    overrides: dict[str, Any] | None = None,
    *,
    cli: bool = False,
) -> LoadedConfig:
    """Accepts a YAML/JSON file path, a dict, or a :class:`Config`; relative paths in a file
    config are relative to the file's folder, otherwise to the working directory.

    ``overrides`` (dotted field -> value, e.g. ``{"stop.max_trials": 5}``) are set on the raw
    config before it is validated (config/overrides.py); ``cli`` names them ``--set KEY`` in
    messages rather than ``overrides['KEY']``."""
    if isinstance(config, LoadedConfig):
        if not overrides:
            return config
        raw, base_dir, source = (
            config.config.model_dump(mode="json", exclude_unset=True),
            config.base_dir,
            config.source,
        )
    elif isinstance(config, Config):
        if not overrides:
            return LoadedConfig(config, Path.cwd(), "config")
        raw, base_dir, source = config.model_dump(mode="json", exclude_unset=True), Path.cwd(), "config"
    elif isinstance(config, dict):
        raw, base_dir, source = config, Path.cwd(), "config"
    else:
        path, raw = _read_file(config)
        base_dir, source = path.resolve().parent, str(path)
    if overrides:
        raw = apply_overrides(raw, overrides, cli=cli)
    loaded = LoadedConfig(_validate(raw, source, overrides, cli), base_dir, source)
    _check_runtime_env(loaded)
    return loaded


def _read_file(config: str | Path) -> tuple[Path, dict[str, Any]]:
    path = Path(config)
    if not path.is_file():
        raise ConfigError(f"no config file at '{config}'")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"not a text file (byte {exc.object[exc.start]:#04x} at offset {exc.start} is not UTF-8); "
            "a config is YAML or JSON text",
            source=str(path),
        ) from None
    except OSError as exc:
        raise ConfigError(f"cannot be read ({exc.strerror or exc})", source=str(path)) from None
    try:
        if path.suffix == ".json":
            raw = json.loads(text, object_pairs_hook=_unique_json)
        else:
            raw = yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader subclass: no arbitrary objects
    except (ValueError, yaml.YAMLError) as exc:
        kind = "JSON" if path.suffix == ".json" else "YAML"
        raise ConfigError(f"not valid {kind}: {_one_line(exc)}", source=str(path)) from None
    if not isinstance(raw, dict):
        raise ConfigError("the top level must be a mapping (model:, data:, passes:, ...)", source=str(path))
    return path, raw


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, but a key given twice in one mapping is an error: PyYAML keeps the
    last silently, so a user who set ``max_trials`` twice would not know which one ran."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base`: its keys may be overridden
                continue
            key = self.construct_object(key_node, deep=deep)  # type: ignore[no-untyped-call]
            line = key_node.start_mark.line + 1
            try:
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None,
                        None,
                        f"key '{key}' is given twice (first at line {seen[key]}; keep one), again",
                        key_node.start_mark,
                    )
                seen[key] = line
            except TypeError:  # an unhashable key: PyYAML's own error follows
                continue
        return super().construct_mapping(node, deep=deep)


def _unique_json(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"key '{key}' appears twice in one object; keep one")
        out[key] = value
    return out


def _one_line(exc: Exception) -> str:
    """PyYAML's messages span lines (problem, excerpt, caret); keep the problem and its place."""
    problem = getattr(exc, "problem", None)
    mark = getattr(exc, "problem_mark", None)
    if problem and mark is not None:
        return f"{problem} at line {mark.line + 1}, column {mark.column + 1}"
    return " ".join(str(exc).split())


def _validate(raw: dict[str, Any], source: str, overrides: dict[str, Any] | None = None, cli: bool = False) -> Config:
    try:
        return Config.model_validate(raw)
    except ValidationError as exc:
        named = None if not overrides else (lambda location: blame(location, overrides, cli))
        raise ConfigError(format_validation_error(exc, named=named), source=source) from None


def format_validation_error(exc: ValidationError, prefix: str = "", named: Any = None) -> str:
    """One line per problem: ``field.path: what is wrong`` (and what is allowed). ``named``
    maps a field path to what the user called it (``--set stop.max_trials``), or None."""
    lines = []
    for error in exc.errors():
        location = ".".join(str(part) for part in (*([prefix] if prefix else []), *error["loc"]))
        label = named(location) if named is not None and location else None
        message = error["msg"]
        if error["type"] == "extra_forbidden":
            message = "unknown field"
            parent = ".".join(str(p) for p in error["loc"][:-1])
            allowed = _allowed_fields(exc, error["loc"][:-1])
            if allowed:
                message += f" (allowed here{' in ' + parent if parent else ''}: {', '.join(allowed)})"
        elif error["type"] == "missing":
            message = "required field is missing"
        elif error["type"] == "value_error":
            message = message.removeprefix("Value error, ")
        lines.append(f"{label or location or '(top level)'}: {message}")
    return "; ".join(lines)


def _allowed_fields(exc: ValidationError, loc: tuple[Any, ...]) -> list[str]:
    model: Any = Config if exc.title == "Config" else None
    for part in loc:
        if model is None:
            return []
        if isinstance(part, int):
            continue
        field = model.model_fields.get(part)
        if field is None:
            return []
        model = _model_of(field.annotation)
    return list(model.model_fields) if model is not None else []


def _model_of(annotation: Any) -> Any:
    from typing import get_args

    from pydantic import BaseModel

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = _model_of(arg)
        if found is not None:
            return found
    return None
