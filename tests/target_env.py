"""A real second Python environment for target tests: a virtual environment with
``onnxruntime-openvino`` (OpenVINO's execution provider runs on x86 CPUs) and numpy, nothing else.

Created once under ``$QUANTUNE_TARGET_VENVS`` (default ``~/.cache/quantune-venvs``) with this
interpreter's ``venv`` and pip from PyPI, and reused while it imports; ``make target-venvs``
does the same. Without network (or on a platform without the wheel) the tests that need it
skip, saying why.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

OPENVINO_PACKAGES = ["onnxruntime-openvino>=1.20", "numpy"]
_PROBE = "import onnxruntime as o; assert 'OpenVINOExecutionProvider' in o.get_available_providers()"


def venvs_root() -> Path:
    return Path(os.environ.get("QUANTUNE_TARGET_VENVS") or Path.home() / ".cache" / "quantune-venvs")


def _works(python: Path) -> bool:
    if not python.is_file():
        return False
    probe = subprocess.run([str(python), "-c", _PROBE], capture_output=True, timeout=120)
    return probe.returncode == 0


def openvino_python() -> tuple[Path | None, str]:
    """The OpenVINO environment's interpreter (created when missing), or ``None`` and why not."""
    root = venvs_root() / "openvino"
    python = root / "bin" / "python"
    if _works(python):
        return python, ""
    try:
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(root)], check=True, capture_output=True)
        install = subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet", *OPENVINO_PACKAGES],
            capture_output=True,
            text=True,
            timeout=900,
        )
    except (subprocess.SubprocessError, OSError) as exc:
        return None, f"cannot create the OpenVINO target environment: {exc}"
    if install.returncode != 0:
        last = (install.stderr.strip().splitlines() or ["pip failed"])[-1]
        return None, f"cannot install {OPENVINO_PACKAGES} (no network?): {last}"
    if not _works(python):
        return None, "onnxruntime-openvino installed, but OpenVINOExecutionProvider is not available on this machine"
    return python, ""


if __name__ == "__main__":  # make target-venvs
    found, why = openvino_python()
    print(found or why)
    sys.exit(0 if found else 1)
