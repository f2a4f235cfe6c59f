"""Same pass config, two source trees: is the built model byte-identical, and how long did each build take?

Each build runs in a subprocess of its own with ``PYTHONPATH=<src>`` (so each tree's quantune
and only it is imported), builds the model once to warm imports and caches, then times a second
build of the same config. The table: config, SHA-256 of ``model.onnx`` from A and B, whether they
are equal, build seconds A and B (wall clock; on a shared machine these are noisy -- the two
builds of a row run one after the other, alternating which tree goes first).

    python bench/build_identity.py --src /work/main/src --src src \
        --model bench/zoo/minilm_l3/model.onnx --config '{"pre_optimize": "extended"}'

Without ``--config`` it runs the configs named in the module's ``DEFAULT_CONFIGS`` for the model's
file name (MiniLM: every weight type x per_channel x reduce_range with extended pre-optimization).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

PASS = "dynamic_quant"

# one build in a fresh interpreter; prints {"sha": ..., "seconds": ...}
WORKER = r"""
import hashlib, json, sys, time
from pathlib import Path
import quantune
from quantune.passes.base import PassContext

name, params, model_in, out_dir = sys.argv[1], json.loads(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4])
pass_cls = quantune.get_pass(name)
config = pass_cls.Config(**params)
seconds = []
for attempt in range(2):  # the first one warms imports (sympy, onnxruntime's quantizer) and the page cache
    out = out_dir / f"model{attempt}.onnx"
    start = time.perf_counter()
    pass_cls().run(config, model_in, out, PassContext(None, [], 1, out_dir))
    seconds.append(time.perf_counter() - start)
digest = hashlib.sha256(out.read_bytes()).hexdigest()
print(json.dumps({"sha": digest, "seconds": seconds[-1], "src": quantune.__file__}))
"""


def default_configs(model: Path) -> list[dict[str, object]]:
    """MiniLM-style: the dynamic configs the search visits with extended pre-optimization; else a short list."""
    grid = itertools.product(("int8", "mixed"), (False, True), (False, True))
    configs: list[dict[str, object]] = [
        {"pre_optimize": "extended", "weight_type": w, "per_channel": pc, "reduce_range": rr} for w, pc, rr in grid
    ]
    if "captcha" in str(model):
        configs = [
            {"pre_optimize": "extended", "weight_type": w, "per_channel": True, "reduce_range": True}
            for w in ("mixed", "int8")
        ]
    return configs


def build(src: Path, params: dict[str, object], model: Path) -> dict[str, object]:
    env = dict(os.environ, PYTHONPATH=str(src.resolve()))
    with tempfile.TemporaryDirectory(prefix="build-identity-") as scratch:
        done = subprocess.run(
            [sys.executable, "-c", WORKER, PASS, json.dumps(params), str(model.resolve()), scratch],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
    if done.returncode != 0:
        raise SystemExit(f"build with {src} failed:\n{done.stderr[-3000:]}")
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    if not str(result["src"]).startswith(str(src.resolve())):
        raise SystemExit(f"{src}: imported {result['src']} instead")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--src", action="append", type=Path, required=True, help="two source trees, A then B")
    parser.add_argument("--model", action="append", type=Path, required=True)
    parser.add_argument("--config", action="append", help="JSON params of the pass (repeatable)")
    args = parser.parse_args()
    if len(args.src) != 2:
        parser.error("give --src twice (A and B)")
    a, b = args.src
    print("| model | config | sha A | sha B | same | build s A | build s B |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    same_all = True
    for model in args.model:
        configs = [json.loads(c) for c in args.config] if args.config else default_configs(model)
        for index, params in enumerate(configs):
            order = (a, b) if index % 2 == 0 else (b, a)
            results = {src: build(src, params, model) for src in order}
            ra, rb = results[a], results[b]
            same = ra["sha"] == rb["sha"]
            same_all &= same
            label = ",".join(f"{k}={v}" for k, v in params.items())
            print(
                f"| {model.parent.name}/{model.name} | {label} | {str(ra['sha'])[:12]} | {str(rb['sha'])[:12]} "
                f"| {'yes' if same else 'NO'} | {float(ra['seconds']):.2f} | {float(rb['seconds']):.2f} |",
                flush=True,
            )
    sys.exit(0 if same_all else 1)


if __name__ == "__main__":
    main()
