#!/usr/bin/env bash
# The provider axis on a machine with an NVIDIA GPU: CUDA (and TensorRT, when onnxruntime-gpu can
# open a session there) searched with the CPU provider, target.providers: auto, on two small models.
#
#   bash bench/gpu_check.sh            # env: PYTHON (default python3), WHEELS (a folder of wheels), OUT
#
# 1. quantune runs under $PYTHON from this checkout (PYTHONPATH=src; its dependencies from $WHEELS
#    when they are missing and a folder is given).
# 2. The target environment: a venv with onnxruntime-gpu (pip install; without a registry, from
#    $WHEELS), else an interpreter that already lists CUDAExecutionProvider; else it says
#    "CUDA EP not available: <why>" and runs the CPU row only (exit 0).
# 3. A short search per model (examples/digits, and an MLP built with onnx.helper), then the table:
#    model, provider, verdict, ratio to the original on the CPU provider, accuracy.
# Not needed by the tests. About 2-6 minutes.
set -u
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PY=${PYTHON:-python3}
OUT=${OUT:-/tmp/quantune-gpu-check}
mkdir -p "$OUT"
export PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"
export QUANTUNE_CACHE_DIR="$OUT/cache"
say() { echo "[gpu_check $(date +%H:%M:%S)] $*"; }

# -- 1. quantune's own interpreter ---------------------------------------------------------------
if ! "$PY" -c "import quantune.api" 2>"$OUT/import.err"; then
  if [ -n "${WHEELS:-}" ] && [ -d "$WHEELS" ]; then
    say "quantune's dependencies missing ($(tail -1 "$OUT/import.err")); installing them from $WHEELS"
    "$PY" -m pip install --quiet --no-index --find-links "$WHEELS" --target "$OUT/deps" \
      pydantic pyyaml optuna rich onnx-ir threadpoolctl sympy 2>&1 | tail -3
    export PYTHONPATH="$PYTHONPATH:$OUT/deps"
  fi
  if ! "$PY" -c "import quantune.api" 2>"$OUT/import.err"; then
    echo "quantune cannot be imported by $PY: $(tail -1 "$OUT/import.err")"
    echo "(install its dependencies: pip install -e . ; or give WHEELS=<folder of wheels>)"
    exit 1
  fi
fi
say "quantune under $("$PY" -c 'import sys; print(sys.executable, sys.version.split()[0])')"

# -- 2. a target environment with the CUDA provider ----------------------------------------------
lists_cuda() { "$1" -c "import onnxruntime as o, sys; sys.exit('CUDAExecutionProvider' not in o.get_available_providers())" 2>/dev/null; }
TARGET="" WHY=""
if ! nvidia-smi -L >/dev/null 2>&1; then
  WHY="no NVIDIA GPU here (nvidia-smi -L failed)"
else
  say "GPU: $(nvidia-smi -L | head -1)"
  for candidate in "$PY" python3 python; do   # an onnxruntime already importable with CUDA, first
    if command -v "$candidate" >/dev/null && lists_cuda "$(command -v "$candidate")"; then
      TARGET=$(command -v "$candidate"); break
    fi
  done
  VENV="$OUT/venv-gpu"
  if [ -z "$TARGET" ] && [ -x "$VENV/bin/python" ] && lists_cuda "$VENV/bin/python"; then
    TARGET="$VENV/bin/python"
  elif [ -z "$TARGET" ]; then
    "$PY" -m venv "$VENV" >/dev/null 2>&1 || WHY="python -m venv failed"
    if [ -x "$VENV/bin/python" ]; then
      if timeout 300 "$VENV/bin/python" -m pip install --quiet --retries 0 --timeout 10 onnxruntime-gpu numpy >"$OUT/pip.log" 2>&1; then :
      elif [ -n "${WHEELS:-}" ] && [ -d "$WHEELS" ]; then
        timeout 300 "$VENV/bin/python" -m pip install --quiet --no-index --find-links "$WHEELS" onnxruntime-gpu numpy \
          >>"$OUT/pip.log" 2>&1
      fi
      if lists_cuda "$VENV/bin/python"; then TARGET="$VENV/bin/python"; fi
    fi
    if [ -z "$TARGET" ]; then
      WHY="onnxruntime-gpu not installable (no registry, no wheel in WHEELS=${WHEELS:-<unset>}: $(tail -1 "$OUT/pip.log" 2>/dev/null)) and no importable onnxruntime lists CUDAExecutionProvider"
    fi
  fi
fi
if [ -n "$TARGET" ]; then
  say "target environment: $TARGET ($("$TARGET" -c 'import onnxruntime as o; print(o.__version__, o.get_available_providers())'))"
else
  echo "CUDA EP not available: $WHY"
  echo "(running the CPU row only)"
fi

# -- 3. two small models, a short search each, the table -----------------------------------------
TARGET="$TARGET" OUT="$OUT" timeout 540 "$PY" - <<'PYEOF'
import json, os, sys, time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import quantune

out, target = Path(os.environ["OUT"]), os.environ.get("TARGET") or None
root = Path.cwd()


def mlp(folder: Path) -> dict:
    """A 256-1024-1024-10 MLP with fixed random weights; labels: its own predictions."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    sizes, nodes, inits, prev = [256, 1024, 1024, 10], [], [], "input"
    for i in range(3):
        w = (rng.normal(0, 1 / np.sqrt(sizes[i]), (sizes[i], sizes[i + 1]))).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(np.zeros(sizes[i + 1], np.float32), f"b{i}")]
        nodes.append(helper.make_node("Gemm", [prev, f"w{i}", f"b{i}"], [f"g{i}"]))
        prev = f"g{i}"
        if i < 2:
            nodes.append(helper.make_node("Relu", [prev], [f"r{i}"]))
            prev = f"r{i}"
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["n", 256])],
        [helper.make_tensor_value_info(prev, TensorProto.FLOAT, ["n", 10])], inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(folder / "model.onnx"))
    import onnxruntime as ort

    x = rng.normal(0, 1, (512, 256)).astype(np.float32)
    s = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    labels = np.argmax(s.run(None, {"input": x[256:]})[0], axis=1).astype(np.int64)
    np.savez(folder / "calib.npz", input=x[:256])
    np.savez(folder / "eval.npz", input=x[256:], label=labels)
    return {"model": str(folder / "model.onnx"), "calibration": str(folder / "calib.npz"), "evaluation": str(folder / "eval.npz")}


digits = root / "examples" / "digits"
cases = {
    "digits CNN": {"model": str(digits / "model.onnx"), "calibration": str(digits / "calib.npz"), "evaluation": str(digits / "eval.npz")},
    "MLP 256-1024-1024-10": mlp(out / "mlp"),
}
rows = []
for name, files in cases.items():
    config = {
        "model": files["model"],
        "data": {"calibration": files["calibration"], "evaluation": files["evaluation"], "batch_size": 64},
        "evaluation": {"metric": "top1", "latency": {"warmup": 5, "repeats": 20, "threads": 1, "confirm_top": 2}},
        "criterion": {"type": "relative", "tolerable_loss": 0.01},
        "passes": [
            {"name": "static_quant", "params": {"quant_format": "QDQ", "activation_type": {"search": ["uint8", "int8"]}, "per_channel": True}},
            {"name": "fp16"},
        ],
        "flows": [["static_quant"], ["fp16"]],
        "target": {"providers": "auto", "timeout_s": 240, **({"python": target} if target else {})},
        "search": {"sampler": "exhaustive"},
        "stop": {"max_trials": 8, "timeout_s": int(os.environ.get("GPU_CHECK_TIMEOUT", "200"))},
        "executor": {"kind": "inline"},
    }
    started = time.time()
    try:
        result = quantune.tune(config, out / "runs" / name.split()[0], restart=True)
    except Exception as exc:
        rows.append((name, "-", f"failed: {type(exc).__name__}: {exc}".splitlines()[0][:120], "-", "-"))
        continue
    data = json.loads((out / "runs" / name.split()[0] / "results.json").read_text())
    base = data["baseline"]
    confirmed = {int(k): r for k, r in ((data.get("latency_confirmation") or {}).get("ratios") or {}).items()}
    reference = data["target"]["provider"]
    on = lambda t: t["params"].get("provider.provider", reference)  # noqa: E731 (one provider: a fixed value)
    skipped = data["target"].get("providers_skipped") or {}
    for provider in data["target"].get("providers", []):
        mine = [t for t in data["trials"] if t["status"] == "ok" and on(t) == provider]
        ok = [t for t in mine if t.get("meets_criterion")]
        best = min(ok, key=lambda t: t["metrics"]["latency_ms"]) if ok else None
        if best is None:
            why = next((t["error"] for t in data["trials"] if on(t) == provider and t["error"]), "")
            rows.append((name, provider, "no trial in budget" + (f" ({why[:80]})" if why else ""), "-", "-"))
            continue
        ratio = confirmed.get(best["number"], {}).get("ratio_median") or best["metrics"]["latency_ms"] / base["latency_ms"]
        label = "original" if best["flow"] == ["provider"] else "+".join(s for s in best["flow"] if s != "provider")
        win = data["verdict"] if data.get("best") and data["best"].get("number") == best["number"] else ""
        rows.append((name, provider, f"{label} (trial {best['number']}) {win}".strip(), f"{ratio:.2f}x", f"{best['metrics']['top1']:.4f}"))
    for provider, why in skipped.items():
        rows.append((name, provider, f"skipped: {why[:90]}", "-", "-"))
    rows.append((name, "verdict", data["verdict_reason"][:150], "", f"{base['top1']:.4f} (original)"))
    print(f"{name}: {time.time() - started:.0f} s", flush=True)

print()
print("| model | provider | verdict | ratio vs CPU original | top1 |")
print("| --- | --- | --- | --- | --- |")
for row in rows:
    print("| " + " | ".join(row) + " |")
PYEOF
rc=$?
[ $rc -eq 124 ] && echo "gpu_check: the searches ran past 9 minutes and were stopped"
exit 0
