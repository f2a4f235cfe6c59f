#!/bin/bash
# The walk-through on captcha_ddddocr: .npz data used directly, a custom metric, timed init -> finished run.
set -e
REPO=$(cd "$(dirname "$0")/../.." && pwd)
PY=${PYTHON:-python}
W=${1:-/tmp/walk-captcha}
Z=${QUANTUNE_ZOO_CACHE:-$HOME/.cache/quantune-zoo}/captcha_ddddocr
rm -rf $W; mkdir -p $W; cd $W
export PYTHONPATH=$REPO/src QUANTUNE_CACHE_DIR=$W/.cache
quantune() { $PY -m quantune.cli "$@"; }
step() { echo; echo "\$ $*"; }
# not timed: the user's starting point, a model, labelled .npz data and the charset its CTC decodes to
cp $Z/model.onnx $Z/calib.npz $Z/eval.npz $Z/charset.txt .
echo "start: $(date -u +%H:%M:%S)"
T0=$(date +%s.%N)
step quantune init model.onnx --data calib.npz eval.npz --metric custom
quantune init model.onnx --data calib.npz eval.npz --metric custom
step "cp bench/zoo/captcha_ddddocr/metric.py metric.py   # the metric: CTC decoding + character accuracy"
cp $REPO/bench/zoo/captcha_ddddocr/metric.py metric.py
step quantune check quantune.yaml --set evaluation.metric=metric.py:char_accuracy
quantune check quantune.yaml --set evaluation.metric=metric.py:char_accuracy
T1=$(date +%s.%N)
step quantune run quantune.yaml --set evaluation.metric=metric.py:char_accuracy --set stop.max_trials=8 --quiet
quantune run quantune.yaml --set evaluation.metric=metric.py:char_accuracy --set stop.max_trials=8 --quiet
T2=$(date +%s.%N)
echo
echo "end: $(date -u +%H:%M:%S)"
python3 -c "print(f'init -> check passed: {$T1-$T0:.0f} s; run: {$T2-$T1:.0f} s; init -> finished run: {$T2-$T0:.0f} s')"
