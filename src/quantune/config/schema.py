"""What a run config may say, as pydantic models; ``quantune schema`` prints the JSON Schema.

A pass parameter is either a fixed value or ``{search: [...]}`` (the values to search), or a
conditional ``{search: {when: parent, cases: {parent_value: [...]}}}``. ``search: true`` on a
pass searches its default space, except parameters given a fixed value.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

MIN_WORKER_MB = 512  # executor.memory_limit_mb below this cannot start a worker (measured: ~400 MB at import)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        """``true`` for a number field is a mistake, not 1: pydantic's lax mode would take it (bool is an
        int in Python), so ``max_trials: true`` ran one trial without a word."""
        if isinstance(value, bool) and info.field_name is not None:
            annotation = cls.model_fields[info.field_name].annotation
            kinds = set(get_args(annotation)) or {annotation}
            if kinds & {int, float} and bool not in kinds:
                raise ValueError(f"{str(value).lower()} is not a number; give a number")
        return value


class DataConfig(_Strict):
    calibration: str | None = Field(
        default=None,
        description="Calibration data: an .npz file or 'path/to/script.py:function' returning a dict of "
        "equal-length arrays (sliced into batches) or a list of dicts (feeds, each run as it is).",
    )
    evaluation: str = Field(
        description="Evaluation data: an .npz file or 'path/to/script.py:function' returning a dict of "
        "equal-length arrays (sliced into batches) or a list of dicts (feeds, each run as it is)."
    )
    batch_size: int = Field(default=32, gt=0, description="Rows per batch for calibration and evaluation.")
    calibration_batch_size: int | None = Field(
        default=None, gt=0, description="Rows per calibration batch (default: batch_size); feeds run as they are."
    )
    evaluation_batch_size: int | None = Field(
        default=None, gt=0, description="Rows per evaluation batch (default: batch_size); feeds run as they are."
    )
    label_key: str = Field(default="label", description="Name of the label array in the evaluation data.")


class LatencyConfig(_Strict):
    # Upper bounds: a number past them is a typo, and would run for ever (or not fit in memory) rather than fail.
    warmup: int = Field(default=10, ge=0, le=100_000)
    repeats: int = Field(default=50, gt=0, le=1_000_000)
    threads: int = Field(default=1, gt=0, le=1024, description="onnxruntime intra-op threads while timing.")
    batch_size: int | None = Field(
        default=None, gt=0, description="Rows in the timed batch of a table (default: the evaluation batch size)."
    )
    feed: int = Field(default=0, ge=0, description="Which evaluation feed (or batch) is timed (default: the first).")
    seconds: float = Field(
        default=10.0,  # evaluate.latency.TIME_SHARE_S
        gt=0,
        le=86_400,
        description="A timing's time share per model timed: no round starts past it, and its fewest rounds are cut to "
        "what it holds at one round's cost; warm-up takes at most a quarter of it (timing is sized by time: "
        "repeats is the most, not the count).",
    )
    confirm_top: int = Field(
        default=2,
        ge=0,
        description="When the objective is latency: at the end, time this many of the best models again, "
        "interleaved with the original, and choose and report on those figures (0: off).",
    )


class EvaluationConfig(_Strict):
    metric: str = Field(
        default="top1",
        description="The accuracy metric the criterion guards: top1 (needs labels), top1_agreement, cosine, "
        "l2, max_abs_diff (agreement with the original model), or 'path/to/script.py:function'.",
    )
    latency: LatencyConfig = Field(default_factory=LatencyConfig)
    runner: str | None = Field(
        default=None,
        description="'path/to/script.py:function' called as runner(session, feeds) -> outputs per feed (a list "
        "of dicts), for the original and every candidate: drives a stateful model as deployed (state carried "
        "between feeds, a decoder loop). Latency then times the runner over the latency feed.",
    )


class CriterionConfig(_Strict):
    type: Literal["relative", "absolute"] = "relative"
    tolerable_loss: float = Field(default=0.01, ge=0)
    higher_is_better: bool | None = Field(
        default=None, description="Direction of the metric; defaults to the built-in metric's own."
    )


class JointSpec(_Strict):
    """Parameters of one pass whose values move together, e.g. iterations with a learning rate."""

    params: list[str] = Field(min_length=2, description="The pass parameters that move together.")
    values: list[list[Any]] = Field(min_length=1, description="One list of values (one per parameter) per choice.")
    weights: list[float] | None = Field(default=None, description="Priority per choice (higher: tried first).")


class PassEntry(_Strict):
    name: str = Field(description="A registered pass, e.g. graph_opt, dynamic_quant, static_quant.")
    id: str | None = Field(default=None, description="Name of this step in results (default: the pass name).")
    search: bool = Field(default=False, description="Search the pass's default space.")
    params: dict[str, Any] = Field(default_factory=dict)
    joint: list[JointSpec] = Field(default_factory=list, description="Coupled parameters searched together.")

    @property
    def step_id(self) -> str:
        return self.id or self.name


class SearchConfig(_Strict):
    sampler: str = Field(default="tpe", description="exhaustive, random, tpe, or a registered sampler.")
    seed: int = Field(default=0, ge=0, le=2**32 - 1, description="Seeds the samplers (numpy's range).")
    strategy: str = Field(
        default="joint",
        description="joint (one space over all passes), pass-by-pass (optimise each pass in turn, continuing "
        "from the best outputs and backtracking), chain (groups in 'groups', each searched jointly), or a "
        "registered strategy.",
    )
    groups: list[list[str]] | None = Field(
        default=None,
        description="For strategy chain: step ids per group, e.g. [[A], [B, C], [D]] for A -> [B, C] -> D.",
    )
    trials_per_group: int | None = Field(
        default=None, gt=0, description="pass-by-pass/chain: trials per group (default: max_trials / groups)."
    )
    keep_best: int = Field(default=3, gt=0, description="pass-by-pass/chain: outputs kept per group for backtracking.")
    strategy_options: dict[str, Any] = Field(
        default_factory=dict,
        description="Options of the chosen strategy (like Neural Compressor's strategy_kwargs), checked against "
        "its options model (listed per strategy under x-strategy-options): e.g. fp32_op_types, fp32_nodes, "
        "int8_op_types, int8_nodes, precisions, flow, sensitivity_rows for every accuracy-driven strategy; "
        "speed_margin, drop_slow, screen_trials, op_type_trials, prune_trials, latency_trials for quantune.",
    )


class Rule(_Strict):
    """Points matching every ``when`` value and any ``forbid`` value are invalid and never run."""

    when: dict[str, Any] = Field(default_factory=dict, description="'<step>.<param>' (or 'flow') -> value")
    forbid: dict[str, list[Any]] = Field(description="'<step>.<param>' (or 'flow') -> values not allowed")


class TargetConfig(_Strict):
    provider: str = Field(
        default="CPUExecutionProvider",
        description="onnxruntime execution provider the model is for: prunes the passes and values it cannot "
        "run, and the original and every candidate are evaluated (accuracy, latency, memory) on it.",
    )
    python: str | None = Field(
        default=None,
        description="A Python interpreter (path) whose environment evaluates the models: its onnxruntime build "
        "and provider, in an isolated server process that needs only numpy and onnxruntime there; passes still "
        "run here. Default: this environment.",
    )
    provider_options: dict[str, Any] = Field(
        default_factory=dict, description="Options of the execution provider (e.g. OpenVINO's device_type)."
    )
    threads: int | None = Field(
        default=None,
        gt=0,
        le=1024,
        description="onnxruntime intra-op threads of the timed and memory-measured sessions on the target "
        "(default: evaluation.latency.threads).",
    )
    timeout_s: float = Field(
        default=600.0,
        gt=0,
        description="A request to the target (loading, evaluating, timing one model) running longer is killed "
        "and fails that trial.",
    )
    providers: Literal["auto"] | list[str] | None = Field(
        default=None,
        description="Search the execution provider too: 'auto' (every provider the target environment has "
        "that runs on this machine; one absent or without its device is skipped with a reason) or a list. "
        "The original on each provider is a candidate, every candidate is measured on its own provider, and "
        "the original on target.provider stays the reference. Default: only target.provider.",
    )

    @field_validator("providers")
    @classmethod
    def _some_providers(cls, value: Any) -> Any:
        if isinstance(value, list) and (not value or len(set(value)) != len(value)):
            raise ValueError("give 'auto' or a list of distinct execution providers")
        return value


class StopConfig(_Strict):
    max_trials: int | None = Field(default=20, gt=0)
    timeout_s: float | None = Field(
        default=None,
        ge=0,
        description="Wall-clock limit over all phases (a trial expected to end after it is not started); "
        "0 means stop at the first trial that meets the criterion (Neural Compressor's timeout: 0).",
    )
    stop_when_met: bool = Field(default=False, description="Stop at the first trial that meets the criterion.")
    n_candidates: int | None = Field(default=None, gt=0, description="Stop once this many trials meet it.")


class ExecutorConfig(_Strict):
    kind: Literal["process", "inline", "ray"] = Field(
        default="process",
        description="process: isolated worker processes (a crash fails one trial); inline: in this process "
        "(for debugging); ray: Ray tasks on a cluster or a local Ray (no shared disk: the model, data and "
        "scripts travel through Ray; models are timed where executor.target says).",
    )
    workers: int = Field(default=1, gt=0, le=1024, description="Trials run at once.")
    trial_timeout_s: float | None = Field(default=None, gt=0, description="A trial running longer is killed.")
    memory_limit_mb: int | None = Field(
        default=None,
        gt=0,
        description=f"Address-space limit of each worker (at least {MIN_WORKER_MB}: Python with numpy and "
        "onnxruntime takes about 400 MB of address space before any model is loaded).",
    )
    address: str | None = Field(default=None, description="ray: cluster address (default: start a local Ray).")
    cpus_per_trial: float = Field(default=1.0, gt=0)
    gpus_per_trial: float = Field(default=0.0, ge=0)
    resources: dict[str, float] = Field(default_factory=dict, description="ray: custom resources per trial.")
    target: str = Field(
        default="driver",
        min_length=1,
        description="ray: where every timing that decides anything runs: 'driver' (the machine running "
        "quantune) or the name of a Ray custom resource the target machines hold (e.g. quantune_target): "
        "then each such node's lane times models, one at a time, each comparison on one node (the nodes "
        "must be alike); builds and evaluations run anywhere.",
    )
    runtime_env: dict[str, Any] | None = Field(
        default=None,
        description="ray: a Ray runtime_env (working_dir, py_modules, excludes, env_vars, pip, ...) given to "
        "every task quantune starts that runs the scripts (trials, stages, builds; the timing lanes run none), with Ray's semantics: for the files a script reaches by path "
        "(sys.path, __file__), which travel to every node only this way (the model, data, scripts and the "
        "modules beside them travel by themselves). A script inside working_dir runs from the node's copy of "
        "that folder. Local paths are relative to the config's folder.",
    )

    @model_validator(mode="after")
    def _target_on_ray(self) -> ExecutorConfig:
        if self.target != "driver" and self.kind != "ray":
            raise ValueError(f"target '{self.target}' (a Ray resource) needs kind: ray; or leave target out")
        return self

    @field_validator("runtime_env")
    @classmethod
    def _runtime_env_on_ray(cls, value: dict[str, Any] | None, info: ValidationInfo) -> dict[str, Any] | None:
        """Only Ray reads it: on another executor it would be ignored without a word. Its local paths
        are checked against the config's folder when the config is loaded (config/loader.py)."""
        if value is None:
            return value
        kind = info.data.get("kind", "ray")  # (a wrong kind is its own error)
        if kind != "ray":
            raise ValueError(f"a Ray runtime_env needs executor.kind: ray (not '{kind}'); or leave it out")
        if not isinstance(value.get("working_dir", ""), str):
            raise ValueError("working_dir must be one path (a folder) or a URI")
        modules = value.get("py_modules", [])
        if not isinstance(modules, list) or not all(isinstance(module, str) for module in modules):
            raise ValueError("py_modules must be a list of paths (folders or .py files) or URIs")
        return value

    @field_validator("memory_limit_mb")
    @classmethod
    def _room_to_start(cls, value: int | None) -> int | None:
        """Below this a worker cannot even import onnxruntime: it failed with a MemoryError (or a
        SyntaxError from a half-read module) that named neither the limit nor the field."""
        if value is not None and 0 < value < MIN_WORKER_MB:
            raise ValueError(
                f"{value} MB is too small to start a worker (Python with numpy and onnxruntime takes about "
                f"400 MB of address space before any model is loaded); give at least {MIN_WORKER_MB}, or leave it unset"
            )
        return value


class PyTorchModelConfig(_Strict):
    """A PyTorch model, exported to ONNX once (cached by its weights, scripts and export settings)."""

    pytorch: str = Field(
        description="'path/to/script.py:function' returning a torch.nn.Module (built and weights loaded), or a "
        "saved torch.export program 'path/to/program.pt2'."
    )
    example_inputs: str | None = Field(
        default=None,
        description="'path/to/script.py:function' returning {input name: tensor or array} (passed to forward "
        "positionally, in that order; the names become the ONNX inputs and must name the data's arrays). "
        "Default: the data's arrays named after forward's parameters, first evaluation batch.",
    )
    exporter: Literal["auto", "dynamo", "torchscript"] = Field(
        default="auto",
        description="auto: torch.onnx.export's dynamo exporter, the TorchScript one where dynamo fails or "
        "gives other outputs than PyTorch.",
    )
    opset: int | None = Field(default=None, ge=13, le=30, description="ONNX opset (default: the exporter's).")

    @property
    def label(self) -> str:
        return f"pytorch: {self.pytorch}"


class Config(_Strict):
    model: str | PyTorchModelConfig = Field(
        description="Path to the input ONNX model (never modified), or {pytorch: script.py:build, "
        "example_inputs: script.py:inputs} for a PyTorch model exported to ONNX first."
    )
    data: DataConfig
    prepare: Literal["auto", "off"] = Field(
        default="auto",
        description="auto: before any pass, bring the model into the form the quantizers assume (Constant "
        "weights to initializers, the opset raised to what the passes need, onnxruntime's basic clean-up such as "
        "constant folding and BatchNorm folding, shape inference), each step checked to keep the outputs on a few "
        "evaluation rows and cached; trials start from the prepared model, the original stays the baseline. "
        "off: trials start from the model as it is.",
    )
    evaluation: EvaluationConfig = Field(default_factory=EvaluationConfig)
    criterion: CriterionConfig = Field(default_factory=CriterionConfig)
    objective: Literal["latency", "size", "memory"] = "latency"
    objectives: list[Literal["accuracy", "latency", "size", "memory"]] | None = Field(
        default=None,
        description="Several objectives: the Pareto front of the trials that meet the criterion is kept and "
        "reported; the best is chosen by these objectives in the declared order.",
    )
    passes: list[PassEntry] = Field(min_length=1)
    flows: list[list[str]] | dict[str, Any] | Literal["auto"] | None = Field(
        default=None,
        description="Pass flows: a list of lists of step ids, or a tree {id: {child id: {...}}} whose root-to-leaf "
        "paths are the flows. Default: one flow of all passes in order. 'auto': quantune places the listed "
        "static_quant, dynamic_quant, transformer_opt, weight_only and fp16 steps (fusion before quantization for "
        "transformers, weight-only where MatMuls have constant weights, fp16 when size is an objective).",
    )
    rules: list[Rule] = Field(default_factory=list, description="Extra pruning rules for the search space.")
    target: TargetConfig = Field(default_factory=TargetConfig)
    search: SearchConfig = Field(default_factory=SearchConfig)
    stop: StopConfig = Field(default_factory=StopConfig)
    cache_dir: str | None = Field(default=None, description="Artifact cache (default ~/.cache/quantune).")
    executor: ExecutorConfig = Field(default_factory=ExecutorConfig)
    plugins: list[str] = Field(
        default_factory=list,
        description="Python files (path/to/file.py) or modules imported first, in the engine and in every "
        "worker, so their passes, samplers and strategies register.",
    )

    @field_validator("prepare", mode="before")
    @classmethod
    def _yaml_switch(cls, value: Any) -> Any:
        """YAML reads an unquoted ``off`` as false (and ``on`` as true): take them as meant."""
        if isinstance(value, bool):
            return "auto" if value else "off"
        return value

    @model_validator(mode="after")
    def _unique_steps(self) -> Config:
        seen: set[str] = set()
        for entry in self.passes:
            if entry.step_id in seen:
                raise ValueError(f"pass '{entry.step_id}' appears twice; give each an 'id'")
            seen.add(entry.step_id)
        return self
