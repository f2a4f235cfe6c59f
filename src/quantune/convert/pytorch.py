"""A PyTorch model as a run's input: exported to ONNX once, then tuned as any ONNX model.

The export (dynamo where it works, else TorchScript) is checked against PyTorch's outputs, with
axes dynamic where the data says they vary. It is cached by everything that decides it
(weights, scripts, structure, example shapes, axes, exporter settings, torch's version).
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import io
import logging
import shutil
import tempfile
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from quantune.config.schema import PyTorchModelConfig
from quantune.data import Dataset
from quantune.errors import ConfigError, QuantuneError
from quantune.evaluate.session import open_session
from quantune.model import file_sha256
from quantune.store import ArtifactCache, cache_key
from quantune.userimport import load_function
from quantune.userlocal import script_fingerprint  # the script and the modules it imports beside it

log = logging.getLogger("quantune.convert")

EXPORT_VERSION = 1  # bump when the exported model for the same inputs changes
_MAX_SINGLE_FILE = 1_800_000_000  # bytes of weights beyond which the model keeps external data (protobuf's 2 GB)


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        raise ConfigError(
            "model.pytorch: needs PyTorch; install it with pip install 'quantune[torch]' "
            "(a CPU build: pip install torch==2.13.0)"
        ) from None
    return torch


def export_pytorch(
    spec: PyTorchModelConfig, base_dir: Path, cache: ArtifactCache, datasets: Sequence[Dataset], batch_size: int
) -> Path:
    """The ONNX model for ``spec`` in ``cache`` (exported now unless cached). ``datasets`` (the
    evaluation data first) give the dynamic axes and the check batch."""
    torch = _torch()
    module, example, sources = _module_and_example(spec, base_dir, datasets, batch_size, torch)
    names = list(example)
    axes = dynamic_axes(example, datasets)
    parts: list[Any] = ["pytorch-export", EXPORT_VERSION, torch.__version__, sources, spec.exporter, spec.opset]
    parts += [{name: [str(t.dtype), list(t.shape)] for name, t in example.items()}, axes]
    if not isinstance(module, torch.export.ExportedProgram):
        parts += [weights_sha256(module, torch), repr(module)]
    key = cache_key(*parts)
    cached = cache.get_model(key)
    if cached is not None:
        log.info("model.pytorch: the ONNX export of %s is in the cache (%s)", spec.pytorch, cached[0])
        return cached[0]
    checks = [example, *_data_check(datasets, names, batch_size, example)]
    expected = [_torch_outputs(module, feed, torch) for feed in checks]
    exporters = ["dynamo", "torchscript"] if spec.exporter == "auto" else [spec.exporter]
    if isinstance(module, torch.export.ExportedProgram):
        exporters = ["dynamo"]  # a program is what the dynamo exporter takes
    failures: list[str] = []
    for exporter in exporters:
        work = cache.new_work_dir()
        try:
            _export(module, example, axes, work / "model.onnx", exporter, spec.opset, torch)
            _check(work / "model.onnx", checks, expected)
        except Exception as exc:
            failures.append(f"{exporter}: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}")
            log.warning("model.pytorch: the %s exporter failed: %s", exporter, failures[-1])
            shutil.rmtree(work, ignore_errors=True)
            continue
        path, _ = cache.put_model(key, work, {"pytorch": spec.pytorch, "exporter": exporter, "dynamic_axes": axes})
        log.info("model.pytorch: exported %s with the %s exporter to %s", spec.pytorch, exporter, path)
        return path
    raise ConfigError(f"model.pytorch: torch.onnx.export of '{spec.pytorch}' failed ({'; '.join(failures)})")


def _module_and_example(
    spec: PyTorchModelConfig, base_dir: Path, datasets: Sequence[Dataset], batch_size: int, torch: Any
) -> tuple[Any, dict[str, Any], list[str | None]]:
    """The module (or exported program), its example inputs by name, and the scripts' hashes."""
    sources: list[str | None] = []
    if spec.pytorch.endswith(".pt2"):
        path = (base_dir / spec.pytorch).resolve()
        if not path.is_file():
            raise ConfigError(f"model.pytorch: no torch.export program at '{spec.pytorch}' (looked in {path.parent})")
        try:
            module = torch.export.load(str(path))
        except Exception as exc:
            raise ConfigError(
                f"model.pytorch: '{spec.pytorch}' does not load as a torch.export program ({exc})"
            ) from None
        sources.append(file_sha256(path))
        parameters = [spec.arg.name for spec in module.graph_signature.input_specs if spec.kind.name == "USER_INPUT"]
        default_example = dict(zip(parameters, module.example_inputs[0], strict=False))
    else:
        if ".py:" not in spec.pytorch:
            raise ConfigError(f"model.pytorch: '{spec.pytorch}' is not 'path/to/script.py:function' or a .pt2 file")
        build = load_function(spec.pytorch, "model.pytorch", base_dir)
        sources.append(script_fingerprint((base_dir / spec.pytorch.rpartition(":")[0]).resolve()))
        try:
            module = build()
        except Exception as exc:
            raise ConfigError(f"model.pytorch: '{spec.pytorch}' raised {type(exc).__name__}: {exc}") from None
        if not isinstance(module, torch.nn.Module):
            raise ConfigError(
                f"model.pytorch: '{spec.pytorch}' returned {type(module).__name__}; expected a torch.nn.Module"
            )
        module.eval()
        parameters = [
            name
            for name, p in inspect.signature(module.forward).parameters.items()
            if p.default is inspect.Parameter.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        default_example = None
    if spec.example_inputs is not None:
        inputs = load_function(spec.example_inputs, "model.example_inputs", base_dir)
        sources.append(script_fingerprint((base_dir / spec.example_inputs.rpartition(":")[0]).resolve()))
        try:
            raw = inputs()
        except Exception as exc:
            raise ConfigError(
                f"model.example_inputs: '{spec.example_inputs}' raised {type(exc).__name__}: {exc}"
            ) from None
        example = _as_named(raw, parameters, "model.example_inputs", torch)
    elif default_example is not None:
        example = _as_named(default_example, list(default_example), "model.pytorch", torch)
    else:
        example = _from_data(datasets, parameters, batch_size, torch)
    return module, example, sources


def _as_named(raw: Any, parameters: list[str], field: str, torch: Any) -> dict[str, Any]:
    """Example inputs as ``{name: tensor}``: a dict as it is, a tuple (or one tensor) named after forward's parameters."""
    if isinstance(raw, dict):
        items = list(raw.items())
    else:
        values = list(raw) if isinstance(raw, (tuple, list)) else [raw]
        if len(values) > len(parameters):
            raise ConfigError(f"{field}: {len(values)} inputs for forward's parameters {parameters}; return a dict")
        items = list(zip(parameters, values, strict=False))
    named: dict[str, Any] = {}
    for name, value in items:
        if isinstance(value, np.ndarray):
            value = torch.from_numpy(np.ascontiguousarray(value))
        if not isinstance(value, torch.Tensor):
            raise ConfigError(f"{field}: input '{name}' is {type(value).__name__}; expected a tensor or a numpy array")
        named[str(name)] = value
    if not named:
        raise ConfigError(f"{field}: no example inputs; return {{input name: tensor}}")
    return named


def _from_data(datasets: Sequence[Dataset], parameters: list[str], batch_size: int, torch: Any) -> dict[str, Any]:
    """The first evaluation batch of the arrays named after forward's parameters."""
    data = datasets[0]
    missing = [name for name in parameters if not data.has(name)]
    if missing or not parameters:
        raise ConfigError(
            f"model.example_inputs: needed: forward takes {parameters} but {data.source} holds {data.names()}; "
            "name 'script.py:function' returning {input name: tensor}"
        )
    feed = next(data.batches(parameters, batch_size))
    return {name: torch.from_numpy(np.ascontiguousarray(feed[name])) for name in parameters}


def dynamic_axes(example: dict[str, Any], datasets: Sequence[Dataset]) -> dict[str, dict[int, str]]:
    """Per input: axis 0 (the batch) and every axis whose size differs between the example and the data."""
    axes: dict[str, dict[int, str]] = {}
    for name, tensor in example.items():
        shapes = [tuple(tensor.shape)] + [shape for data in datasets for shape in _shapes(data, name)]
        rank = len(shapes[0])
        varying = {axis for axis in range(rank) if len({s[axis] for s in shapes if len(s) == rank}) > 1 or axis == 0}
        axes[name] = {axis: ("batch" if axis == 0 else f"{name}_dim{axis}") for axis in sorted(varying)}
    return axes


def _shapes(data: Dataset, name: str) -> list[tuple[int, ...]]:
    if not data.has(name):
        return []
    if data.is_table:
        return [tuple(data.arrays[name].shape)]
    return [tuple(np.shape(feed[name])) for feed in data.feeds or ()]


def weights_sha256(module: Any, torch: Any) -> str:
    """sha256 over every ``state_dict`` entry: name, dtype, shape and bytes."""
    digest = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        if not isinstance(tensor, torch.Tensor):
            digest.update(f"{name}|{tensor!r}".encode())
            continue
        value = tensor.detach().cpu().contiguous()
        digest.update(f"{name}|{value.dtype}|{tuple(value.shape)}|".encode())
        digest.update(value.view(-1).view(torch.uint8).numpy().tobytes() if value.numel() else b"")
    return digest.hexdigest()


def _data_check(
    datasets: Sequence[Dataset], names: list[str], batch_size: int, example: dict[str, Any]
) -> list[dict[str, Any]]:
    """The first evaluation batch (when it holds every input and differs in shape from the example)."""
    data = datasets[0] if datasets else None
    if data is None or not all(data.has(name) for name in names):
        return []
    feed = next(data.batches(names, batch_size), None)
    if feed is None or all(tuple(feed[n].shape) == tuple(example[n].shape) for n in names):
        return []
    return [{name: np.ascontiguousarray(feed[name], dtype=example[name].numpy().dtype) for name in names}]


def _torch_outputs(module: Any, feed: dict[str, Any], torch: Any) -> list[np.ndarray]:
    args = [value if isinstance(value, torch.Tensor) else torch.from_numpy(value) for value in feed.values()]
    runnable = module.module() if isinstance(module, torch.export.ExportedProgram) else module
    try:
        with torch.no_grad():
            produced = runnable(*args)
    except Exception as exc:
        raise ConfigError(f"model.pytorch: forward failed on the example inputs: {type(exc).__name__}: {exc}") from None
    flat = produced if isinstance(produced, (tuple, list)) else [produced]
    return [t.detach().cpu().numpy() for t in flat if isinstance(t, torch.Tensor)]


def _export(
    module: Any, example: dict[str, Any], axes: dict, path: Path, exporter: str, opset: int | None, torch: Any
) -> None:
    args = tuple(example.values())
    outputs = _torch_outputs(module, example, torch)
    output_names = ["output"] if len(outputs) == 1 else [f"output_{i}" for i in range(len(outputs))]
    output_axes = {name: {0: "batch"} for name, out in zip(output_names, outputs, strict=True) if out.ndim}
    kwargs: dict[str, Any] = {
        "input_names": list(example),
        "output_names": output_names,
        "dynamo": exporter == "dynamo",
    }
    if not isinstance(module, torch.export.ExportedProgram):  # a program's dynamic shapes are its own
        kwargs["dynamic_axes"] = {**axes, **output_axes}
    if opset is not None:
        kwargs["opset_version"] = opset
    printed = io.StringIO()
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings(), contextlib.redirect_stdout(printed):
        warnings.simplefilter("ignore")  # the TorchScript exporter is "legacy"; dynamo warns about its choices
        raw = Path(tmp) / "model.onnx"
        torch.onnx.export(module, args, str(raw), **kwargs)
        proto = onnx.load(str(raw), load_external_data=True)  # dynamo writes weights beside the model
    if printed.getvalue():
        log.info("torch.onnx.export (%s) printed:\n%s", exporter, printed.getvalue().rstrip())
    large = sum(len(t.raw_data) for t in proto.graph.initializer) > _MAX_SINGLE_FILE
    onnx.save_model(proto, str(path), save_as_external_data=large, location="model.onnx.data")


def _check(path: Path, feeds: list[dict[str, Any]], expected: list[list[np.ndarray]]) -> None:
    """onnxruntime must give PyTorch's outputs (float: within 1e-3 relative plus 1e-4 of the largest magnitude)."""
    session = open_session(path, threads=0)
    for index, (feed, want) in enumerate(zip(feeds, expected, strict=True)):
        arrays = {name: (v.numpy() if hasattr(v, "numpy") else v) for name, v in feed.items()}
        got = session.run(None, arrays)
        if len(got) != len(want):
            raise QuantuneError(f"{len(got)} outputs, PyTorch gives {len(want)}")
        for position, (a, b) in enumerate(zip(got, want, strict=True)):
            if a.shape != b.shape:
                raise QuantuneError(f"output {position} on check feed {index}: shape {a.shape}, PyTorch {b.shape}")
            if np.issubdtype(b.dtype, np.floating):
                scale = float(np.max(np.abs(b))) if b.size else 0.0
                if not np.allclose(a, b, rtol=1e-3, atol=1e-4 * max(scale, 1e-12)):
                    raise QuantuneError(f"output {position} on check feed {index} differs from PyTorch's")
            elif not np.array_equal(a, b):
                raise QuantuneError(f"output {position} on check feed {index} differs from PyTorch's")


def describe_export(path: Path) -> str:
    """One line on how the cached export at ``path`` was made (for the console and results.json)."""
    import json

    try:
        meta = json.loads((Path(path).parent / "meta.json").read_text())
    except (OSError, ValueError):
        return "exported from PyTorch"
    axes = {name: sorted(int(axis) for axis in dims) for name, dims in (meta.get("dynamic_axes") or {}).items()}
    return (
        f"exported from PyTorch ({meta.get('pytorch')}) with the {meta.get('exporter')} exporter; dynamic axes {axes}"
    )
