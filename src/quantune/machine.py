"""The machine and the library versions a run was measured on, recorded in results.json.

Latencies mean little without them: an int8 model is fast on a CPU with VNNI (or AMX) and
may be slower than fp32 on one without, and onnxruntime's kernels change between releases.
The record is taken when the results are written, so a report made later on another machine
still names the machine that produced the figures.
"""

from __future__ import annotations

import os
import platform
from importlib import metadata
from typing import Any

# CPU flags that decide how fast quantized (and fp16/bf16) kernels can be.
SPEED_FLAGS = (
    "sse4_1",
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512_vnni",
    "avx_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
    "amx_int8",
    "amx_bf16",
    "asimd",
    "asimddp",
    "i8mm",
    "sve",
)
_PACKAGES = ("quantune", "onnxruntime", "onnx", "optuna", "numpy", "plotly")


def machine_info() -> dict[str, Any]:
    """CPU model, its speed-relevant flags, cores, OS and the versions of the libraries that measured."""
    cpu = _cpuinfo()
    return {
        "cpu_model": cpu.get("model name") or cpu.get("Model") or platform.processor() or platform.machine(),
        "cpu_flags": [flag for flag in SPEED_FLAGS if flag in set(cpu.get("flags", cpu.get("Features", "")).split())],
        "logical_cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "physical_cores": _physical_cores(),
        "machine": platform.machine(),
        "os": platform.platform(terse=True),
        "python": platform.python_version(),
        "versions": {name: _version(name) for name in _PACKAGES},
    }


def is_x86() -> bool:
    """Whether this machine is x86 (where onnxruntime's int8 kernels have the fast paths and the slow
    ones its documentation names)."""
    return platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")


def int8_saturates() -> bool:
    """Whether this CPU's int8 dot products can saturate (x86 with neither VNNI nor AMX), where
    ``vpmaddubsw``'s 16-bit sums saturate unless weights use 7 bits (``reduce_range``)."""
    if not is_x86():
        return False
    flags = set(cpu_flags().split())
    if not flags:
        return False  # cannot tell: assume a modern CPU
    return not flags & {"avx512_vnni", "avx_vnni", "amx_int8"}


def cpu_flags() -> str:
    """The first processor's flags as /proc/cpuinfo lists them ("" where there is none)."""
    return _cpuinfo().get("flags", "")


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        if package == "quantune":
            from quantune._version import __version__

            return __version__
        return None


def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo (empty where there is none)."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if not line.strip():
                    if fields:
                        break
                    continue
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return fields


def _physical_cores() -> int | None:
    """Distinct (package, core) pairs in /proc/cpuinfo; None where it does not say."""
    pairs: set[tuple[str, str]] = set()
    physical = core = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "physical id":
                    physical = value.strip()
                elif key == "core id":
                    core = value.strip()
                    pairs.add((physical, core))
    except OSError:
        return None
    return len(pairs) or None
