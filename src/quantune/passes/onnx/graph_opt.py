"""onnxruntime graph optimization, saved as a model file.

The optimized model is what onnxruntime would build in memory at session start; saving it
lets later passes (quantization) start from fused operators. Level ``all`` adds layout
transformations specific to the CPU it ran on, so the saved file is for this kind of CPU.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import onnxruntime as ort

from quantune.passes.base import Pass, PassConfig, PassContext
from quantune.passes.onnx.pre_optimize import save_optimized
from quantune.passes.registry import register_pass
from quantune.space import Categorical

_LEVELS = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}


class GraphOptimizationConfig(PassConfig):
    level: Literal["disable", "basic", "extended", "all"] = "basic"


@register_pass
class GraphOptimization(Pass):
    """Runs onnxruntime's graph optimizer at ``level`` and saves the result."""

    name = "graph_opt"
    role = "optimize"
    restructuring = True
    Config = GraphOptimizationConfig
    search_space = {"level": Categorical(("basic", "extended", "all"))}

    @classmethod
    def keeps_graph(cls, config: Any) -> bool:
        return getattr(config, "level", None) == "disable"

    def run(self, config: GraphOptimizationConfig, model_in: Path, model_out: Path, context: PassContext) -> None:
        save_optimized(model_in, model_out, _LEVELS[config.level])
