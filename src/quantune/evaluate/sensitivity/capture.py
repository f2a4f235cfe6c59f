"""Which intermediate tensors one session run captures: each statistic a :class:`Job`, packed in graph order into groups
that fit the memory budget (sizes by shape inference); batches are cut along a free first axis when one job does not
fit."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, shape_inference

from quantune.data.dataset import feed_rows
from quantune.model import without_weights

log = logging.getLogger("quantune.sensitivity")

Feed = dict[str, np.ndarray]
Feeds = Callable[[], Iterable[Feed]]
# ORT hands every captured output over as a fresh array while it still holds its own: twice.
_COPIES = 2


@dataclass(frozen=True)
class Job:
    """One statistic: the tensors it reads from each model, and those it makes anew (``made``)."""

    key: str
    quant: tuple[str, ...] = ()
    float: tuple[str, ...] = ()
    made: tuple[str, ...] = ()


@dataclass
class Plan:
    rows: int | None  # rows per run (None: batches are run as they come)
    groups: list[list[Job]]
    total_rows: int = 0  # in the data


def replayable(batches: Iterable[Feed] | Feeds) -> Feeds:
    """``batches`` as a function that reads them afresh; a one-shot iterator is kept in a list."""
    if callable(batches):
        return batches
    if not isinstance(batches, Sequence):
        batches = list(batches)
    return lambda: iter(batches)


def batch_dim_free(model: onnx.ModelProto) -> bool:
    """Whether every graph input's first dimension is symbolic (so a batch may be cut)."""
    inits = {init.name for init in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in inits]
    for value in inputs:
        dims = value.type.tensor_type.shape.dim
        if not dims or dims[0].HasField("dim_value"):
            return False
    return bool(inputs)


def input_shapes(feeds: Feeds, names: set[str], per_row: bool) -> list[dict[str, tuple[int, ...]]]:
    """The distinct shapes the model's inputs take over the data (batch dimension 1 when ``per_row``)."""
    seen: dict[tuple, dict[str, tuple[int, ...]]] = {}
    for feed in feeds():
        shapes = {k: tuple(np.shape(v)) for k, v in feed.items() if k in names}
        if per_row:
            shapes = {k: (1, *s[1:]) if s else s for k, s in shapes.items()}
        seen.setdefault(tuple(sorted(shapes.items())), shapes)
    return list(seen.values())


def tensor_bytes(model: onnx.ModelProto, shapes: Mapping[str, Sequence[int]]) -> dict[str, int]:
    """Bytes of each tensor of ``model`` whose shape inference settles at these input shapes."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for value in copy.graph.input:
        if value.name in shapes and value.type.tensor_type.HasField("shape"):
            dims = value.type.tensor_type.shape.dim
            for dim, size in zip(dims, shapes[value.name], strict=False):
                dim.Clear()
                dim.dim_value = int(size)
    try:
        inferred = shape_inference.infer_shapes(copy, data_prop=True)
    except Exception as exc:  # a model shape inference does not understand: sizes unknown
        log.info("shape inference failed (%s); captured tensors are sized conservatively", exc)
        return {}
    sizes: dict[str, int] = {}
    for value in [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]:
        kind = value.type.tensor_type
        if not kind.HasField("shape") or not kind.elem_type:
            continue
        dims = [d.dim_value if d.HasField("dim_value") else -1 for d in kind.shape.dim]
        if any(d < 0 for d in dims):
            continue
        try:
            itemsize = np.dtype(helper.tensor_dtype_to_np_dtype(kind.elem_type)).itemsize
        except Exception:
            itemsize = 4
        sizes[value.name] = int(np.prod(dims, dtype=np.int64)) * itemsize
    for init in inferred.graph.initializer:
        sizes[init.name] = int(np.prod(init.dims, dtype=np.int64)) * 4
    return sizes


def _largest(per_shape: list[dict[str, int]]) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for shape_sizes in per_shape:
        for name, size in shape_sizes.items():
            sizes[name] = max(size, sizes.get(name, 0))
    return sizes


def plan_groups(
    jobs: Sequence[Job],
    quant_sizes: Mapping[str, int],
    float_sizes: Mapping[str, int],
    budget_bytes: float,
    max_rows: int,
    splittable: bool,
) -> Plan:
    """Jobs packed in order into groups whose captured tensors fit the budget (unknown sizes count as the largest)."""
    fallback = max([*quant_sizes.values(), *float_sizes.values()], default=0) or budget_bytes

    def tensors(job: Job) -> dict[tuple[str, str], float]:
        found = {("q", n): quant_sizes.get(n, fallback) for n in job.quant}
        found.update({("f", n): float_sizes.get(n, fallback) for n in job.float})
        return found

    def own(job: Job) -> float:
        return 2 * sum(float_sizes.get(n, fallback) for n in job.made)

    def cost(captured: Mapping, made: float) -> float:
        return _COPIES * sum(captured.values()) + made

    largest = max((cost(tensors(job), own(job)) for job in jobs), default=0.0)
    rows = None
    capacity = budget_bytes
    if splittable:
        rows = max(1, min(max_rows, int(budget_bytes // max(largest, 1.0))))
        capacity = budget_bytes / rows
    groups: list[list[Job]] = []
    captured: dict[tuple[str, str], float] = {}
    made = 0.0
    for job in jobs:
        mine, mine_made = tensors(job), own(job)
        merged = {**captured, **mine}
        if groups and groups[-1] and cost(merged, max(made, mine_made)) <= capacity:
            groups[-1].append(job)
            captured, made = merged, max(made, mine_made)
            continue
        groups.append([job])
        captured, made = mine, mine_made
    return Plan(rows, groups)


def plan(
    jobs: Sequence[Job],
    fmodel: onnx.ModelProto,
    qmodel: onnx.ModelProto | None,
    feeds: Feeds,
    budget_mb: float,
) -> Plan:
    """The groups (and rows per run) for ``jobs`` over the data ``feeds()`` gives."""
    inits = {init.name for init in fmodel.graph.initializer}
    names = {i.name for i in fmodel.graph.input if i.name not in inits}
    splittable = batch_dim_free(fmodel)
    shapes = input_shapes(feeds, names, per_row=splittable)
    counts = [feed_rows(feed) for feed in feeds()]
    max_rows = max(counts, default=1) if splittable else 1
    light = without_weights(fmodel)  # one copy for every shape, not the whole model per shape
    float_sizes = _largest([tensor_bytes(light, s) for s in shapes])
    if qmodel is not None:
        light = without_weights(qmodel)
        quant_sizes = _largest([tensor_bytes(light, s) for s in shapes])
    else:
        quant_sizes = {}
    del light
    result = plan_groups(jobs, quant_sizes, float_sizes, budget_mb * 1024 * 1024, max_rows, splittable)
    result.total_rows = sum(counts)
    log.info(
        "sensitivity: %d statistics in %d capture group(s), %s rows a run (budget %.0f MB)",
        len(jobs),
        len(result.groups),
        result.rows or "whole batches,",
        budget_mb,
    )
    return result


def pieces(feeds: Feeds, rows: int | None) -> Iterator[Feed]:
    """The data, each batch cut along its first axis into pieces of at most ``rows``."""
    for feed in feeds():
        n = feed_rows(feed)
        if rows is None or n <= rows:
            yield feed
            continue
        for start in range(0, n, rows):
            yield {k: v[start : start + rows] for k, v in feed.items()}
