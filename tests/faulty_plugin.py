"""A pass that fails on purpose in the ways a real pass can (crash, memory, hang, exception),
written to a file so spawned workers and Ray workers import it as a config plugin."""

from __future__ import annotations

from pathlib import Path

FAULTY_PLUGIN = '''
from __future__ import annotations
import ctypes, shutil, time
from typing import Literal
import numpy as np
from quantune import Pass, PassConfig, register_pass

class FaultConfig(PassConfig):
    mode: Literal["ok", "segfault", "oom", "hang", "raise"] = "ok"

@register_pass
class Faulty(Pass):
    """Copies the model, or fails in the way ``mode`` names."""
    name = "faulty"
    Config = FaultConfig
    def run(self, config, model_in, model_out, context):
        if config.mode == "segfault":
            ctypes.string_at(0)
        if config.mode == "oom":
            np.empty(64 * 2**30, dtype=np.uint8)
        if config.mode == "hang":
            time.sleep(3600)
        if config.mode == "raise":
            raise ValueError("faulty pass raised on purpose")
        shutil.copyfile(model_in, model_out)
'''


def write_plugin(folder: Path) -> str:
    path = folder / "faulty.py"
    path.write_text(FAULTY_PLUGIN)
    return str(path)
