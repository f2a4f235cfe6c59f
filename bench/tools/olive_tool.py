"""Olive: the OnnxStaticQuantization pass with its searchable parameters, TPE sampler, an accuracy
(custom metric, goal: at most the case's relative degradation) + latency evaluator.

Usage: python olive_tool.py CASE.json OUT_DIR [static|dynamic|bert|bert-nosession]   (runs in venv-olive)

``dynamic``: the OnnxDynamicQuantization pass instead (no calibration data), same search.
``bert``: Olive's BERT CPU recipe (its examples/bert/bert_ptq_cpu.json, from ONNX on): the
OrtTransformersOptimization pass (model type bert, heads and hidden size 0 = read from the
graph) -> OnnxQuantization (static or dynamic searched; preprocess on, per-tensor, no reduced
range, MinMax, as the example) -> OrtSessionParamsTuning at its defaults, searched jointly.
``bert-nosession``: the same without the session tuning step.

Olive ignores its sampler's max_samples/seed, so the trial limit is ``max_iter``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import Scorer, batches, calibration_batches, load_case, stop_by_limits, write_result

CASE: dict = {}
SCORER: Scorer | None = None


class _Items:
    """A map-style dataset of (inputs dict, label) pairs, as Olive's dataloaders expect."""

    def __init__(self, items: list[dict]) -> None:
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int):
        return {key: value[0] for key, value in self.items[index].items()}, 0


def bench_calibration_dataset(**_kwargs):
    return _Items(calibration_batches(CASE, batch_size=1))


def bench_latency_dataset(**_kwargs):
    data = SCORER.data
    return _Items(list(batches(data, CASE["input_names"], 1, limit=CASE["batch_size"])))


def evaluate(model, device=None, execution_providers=None) -> float:
    """Olive's custom metric; Olive imports this file again as a user script, so the scorer
    (which counts the evaluations) is the one of the running tool, ``__main__``."""
    import __main__

    return __main__.SCORER.score(model.model_path)


def passes(approach: str) -> dict:
    """The Olive passes of one row (see the module docstring)."""
    if approach == "static":
        return {
            "quantization": {"type": "OnnxStaticQuantization", "data_config": "calibration", "quant_preprocess": False}
        }
    if approach == "dynamic":
        return {"quantization": {"type": "OnnxDynamicQuantization", "quant_preprocess": False}}
    if approach not in ("bert", "bert-nosession"):
        raise SystemExit(f"unknown approach '{approach}': static, dynamic, bert or bert-nosession")
    recipe = {
        "transformers_optimization": {
            "type": "OrtTransformersOptimization",
            "model_type": "bert",
            "num_heads": 0,
            "hidden_size": 0,
            "float16": False,
            "only_onnxruntime": False,
        },
        "quantization": {
            "type": "OnnxQuantization",
            "quant_preprocess": True,
            "per_channel": False,
            "reduce_range": False,
            "calibrate_method": "MinMax",
            "data_config": "calibration",
        },
    }
    if approach == "bert":
        recipe["session_params_tuning"] = {"type": "OrtSessionParamsTuning", "data_config": "latency"}
    return recipe


def inference_settings(best) -> dict | None:
    """The session options Olive's best model carries (what OrtSessionParamsTuning chose), if any."""
    return best.get_inference_config() or None if best is not None else None


QUANT_KEYS = ("quant_mode", "quant_format", "precision", "activation_type", "weight_type", "calibrate_method")


def footprint_nodes(out: Path) -> dict:
    """Olive's footprint of the run (every model it made, its pass, metrics and goals), or {}."""
    import json

    path = out / "output" / "footprint.json"
    if not path.is_file():
        return {}
    nodes = json.loads(path.read_text())
    return nodes.get("nodes", nodes)


def recipe_of(model_id: str | None, nodes: dict) -> list[dict] | None:
    """A model's passes, first to last, with the quantization's chosen values (from the footprint)."""
    if model_id is None or model_id not in nodes:
        return None
    steps = []
    while model_id in nodes and nodes[model_id].get("from_pass"):
        node = nodes[model_id]
        config = node.get("pass_run_config") or {}
        # a parameter the search point ignored (dynamic mode's format) stays a search-space dict: left out
        chosen = {k: config[k] for k in QUANT_KEYS if isinstance(config.get(k), (str, int, float, bool))}
        steps.append({"pass": node["from_pass"], **chosen})
        model_id = node.get("parent_model_id")
    return steps[::-1]


def fastest_in_budget(nodes: dict) -> dict | None:
    """Among the models that met Olive's goals, the one its own latency metric found fastest.

    Olive's best candidate is ranked by its metrics' priorities (accuracy first, as its BERT
    example has it), so on a latency bench its fastest model within the budget is a row too.
    """
    found = []
    for model_id, node in nodes.items():
        metrics = node.get("metrics") or {}
        values = metrics.get("value") or {}
        config = (node.get("model_config") or node.get("model_config_data") or {}).get("config") or {}
        if (
            node.get("from_pass")
            and metrics.get("if_goals_met")
            and "latency-avg" in values
            and config.get("model_path")
        ):
            found.append((values["latency-avg"]["value"], model_id, config["model_path"], values))
    if not found:
        return None
    latency, model_id, path, values = min(found)
    path = Path(path)
    if path.is_dir():
        path = next(path.glob("*.onnx"))
    return {
        "model": str(path),
        "olive_latency_avg_ms": latency,
        "olive_accuracy": values.get("accuracy-score", {}).get("value"),
        "recipe": recipe_of(model_id, nodes),
    }


def main() -> None:
    global CASE, SCORER
    CASE = load_case(sys.argv[1])
    out = Path(sys.argv[2]).resolve()
    approach = sys.argv[3] if len(sys.argv) > 3 else "static"
    out.mkdir(parents=True, exist_ok=True)
    import olive
    from olive.data.registry import Registry
    from olive.evaluator.metric import Metric, SubMetric

    # Olive 0.13 cannot serialize a custom metric (its backend and metric_config are None:
    # "'NoneType' object has no attribute 'model_dump'"), which every run does: let its
    # serializers pass None through
    def serialize_optional(self, value):
        return value if value is None or isinstance(value, str) else value.model_dump()

    for model, name in ((Metric, "serialize_backend"), (SubMetric, "serialize_metric_config")):
        model.__pydantic_decorators__.field_serializers[name].func.__code__ = serialize_optional.__code__
    # ... and its resource finder then trips on those None values ({"type": None}) with an
    # AttributeError where it expects a ValueError for "not a resource"
    import olive.resource_path as resource_path

    create_resource_path = resource_path.create_resource_path

    def tolerant_create_resource_path(value):
        try:
            return create_resource_path(value)
        except AttributeError as exc:
            raise ValueError(str(exc)) from None

    resource_path.create_resource_path = tolerant_create_resource_path
    # ... and its configs' round trips through dicts drop the metric's user_config (pydantic dumps
    # a field by its declared type, ConfigBase, which has no fields): dump as the actual type
    from olive.common.config_utils import ConfigBase

    model_dump = ConfigBase.model_dump

    def model_dump_as_any(self, *args, **kwargs):
        kwargs.setdefault("serialize_as_any", True)
        return model_dump(self, *args, **kwargs)

    ConfigBase.model_dump = model_dump_as_any

    # ... and a pass output loaded from its cache (every search point after the first reuses the
    # transformer optimization's) is recorded under the field's alias, which pydantic refuses:
    # '"FootprintNode" object has no field "model_config"'
    from olive.engine.footprint import FootprintNode

    def update_by_alias(self, **kwargs):
        for key, value in kwargs.items():
            setattr(self, "model_config_data" if key == "model_config" else key, value)

    FootprintNode.update = update_by_alias

    Registry.register_dataset("bench_calibration_dataset")(bench_calibration_dataset)
    Registry.register_dataset("bench_latency_dataset")(bench_latency_dataset)
    SCORER = Scorer(CASE)
    batch = CASE["batch_size"]
    config = {
        "input_model": {"type": "ONNXModel", "model_path": CASE["model"]},
        "systems": {
            "local_system": {
                "type": "LocalSystem",
                "accelerators": [{"device": "cpu", "execution_providers": ["CPUExecutionProvider"]}],
            }
        },
        "data_configs": [
            {
                "name": "calibration",
                "load_dataset_config": {"type": "bench_calibration_dataset"},
                "dataloader_config": {"batch_size": 1},
            },
            {
                "name": "latency",
                "load_dataset_config": {"type": "bench_latency_dataset"},
                "dataloader_config": {"batch_size": batch},
            },
        ],
        "evaluators": {
            "bench": {
                "metrics": [
                    {
                        "name": "accuracy",
                        "type": "custom",
                        "sub_types": [
                            {
                                "name": "score",
                                "priority": 1,
                                "higher_is_better": CASE["higher_is_better"],
                                "goal": {"type": "percent-max-degradation", "value": CASE["tolerable_loss"] * 100},
                            }
                        ],
                        "user_config": {"user_script": __file__, "evaluate_func": "evaluate"},
                    },
                    {
                        "name": "latency",
                        "type": "latency",
                        "data_config": "latency",
                        "sub_types": [{"name": "avg", "priority": 2}],
                        "user_config": {
                            "inference_settings": {"onnx": {"session_options": {"intra_op_num_threads": 1}}}
                        },
                    },
                ]
            }
        },
        "passes": passes(approach),
        "search_strategy": {
            "execution_order": "joint",
            "sampler": "tpe",
            "max_iter": CASE["max_trials"],
            "max_time": int(CASE["timeout_s"]),
        },
        "evaluator": "bench",
        "host": "local_system",
        "target": "local_system",
        "cache_dir": str(out / "cache"),
        "output_dir": str(out / "output"),
        "log_severity_level": 1,
    }
    started = time.perf_counter()
    SCORER.restart_clock()
    workflow = olive.run(config)
    total = time.perf_counter() - started
    best = workflow.get_best_candidate() if workflow is not None else None
    path = None
    if best is not None and best.model_path:
        path = Path(best.model_path)
        if path.is_dir():
            path = next(path.glob("*.onnx"))
    write_result(
        out,
        {
            "tool": f"olive-{approach}",
            "status": "ok" if path else "no model met the budget",
            "model": str(path) if path else None,
            "first_feasible_s": SCORER.first_feasible_s,
            "total_s": total,
            "evaluations": SCORER.evaluations,
            "first_feasible_evaluations": SCORER.first_feasible_evaluations,
            "tool_metric": best.metrics_value if best is not None else None,
            "stop": stop_by_limits(path is not None, SCORER.evaluations, CASE, total, "search space exhausted"),
            "inference_settings": inference_settings(best),
            "recipe": recipe_of(best.model_id if best is not None else None, footprint_nodes(out)),
            "fastest_in_budget": fastest_in_budget(footprint_nodes(out)),
            "history": SCORER.history,
        },
    )


if __name__ == "__main__":
    main()
