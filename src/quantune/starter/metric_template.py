"""The ``metric.py`` template that ``quantune init`` writes: a custom metric whose docstring
says exactly what it receives for this model (output names and shapes, the evaluation
arrays), and whose body is a working start (top-1 against labels) to replace."""

from __future__ import annotations

from quantune.starter.model_info import ModelInfo

TEMPLATE = '''"""A custom accuracy metric for {model}, written by `quantune init`. Edit it: it is yours.

Use it with `evaluation.metric: metric.py:score` in quantune.yaml (and, if lower is better,
`criterion.higher_is_better: false`).
"""

from __future__ import annotations

import numpy as np


def score(outputs: dict, data: dict) -> float:
    """One finite number for the whole evaluation set; quantune calls it for the original model
    and for every candidate, and the criterion compares the candidate's with the original's.

    outputs: model output name -> the model's output over all evaluation data, stacked along
        axis 0 (batches or feeds concatenated) when every feed's output has the same shape after
        axis 0, else a list with one array per feed. This model's outputs:
{outputs}
    data: the evaluation data's arrays, the same way: the model inputs
{inputs}
        plus any other array the data holds (e.g. "label"), stacked when they stack, else one per
        feed. No reference outputs: compare with the original model through a built-in
        agreement metric (cosine, top1_agreement, l2, max_abs_diff) instead.
    """
    logits = outputs[{first!r}]
    if "label" not in data:
        raise ValueError("metric.py: score() needs a 'label' array in the evaluation data (EDIT the metric)")
    if isinstance(logits, list):  # outputs that do not stack: score each feed, weigh by its rows
        hits = [np.argmax(out, axis=-1).reshape(-1) == np.asarray(lab).reshape(-1) for out, lab in zip(logits, data["label"])]
        return float(np.mean(np.concatenate(hits)))
    # EDIT: your task's measure (F1, character accuracy, mAP, ...). This is top-1 accuracy.
    return float(np.mean(np.argmax(logits, axis=-1).reshape(-1) == np.asarray(data["label"]).reshape(-1)))
'''


def render_metric(info: ModelInfo) -> str:
    outputs = "\n".join(f"            {spec.describe()}" for spec in info.outputs)
    inputs = "\n".join(f"            {spec.describe()}" for spec in info.inputs)
    first = info.outputs[0].name if info.outputs else "output"
    return TEMPLATE.format(model=info.path.name, outputs=outputs, inputs=inputs, first=first)
