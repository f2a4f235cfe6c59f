#!/bin/bash
# The README walk-through on ppocr_cls, timed from `quantune init` to a finished run.
set -e
REPO=$(cd "$(dirname "$0")/../.." && pwd)
PY=${PYTHON:-python}
W=${1:-/tmp/walk-ppocr}
rm -rf $W; mkdir -p $W; cd $W
export PYTHONPATH=$REPO/src QUANTUNE_CACHE_DIR=$W/.cache
quantune() { $PY -m quantune.cli "$@"; }
step() { echo; echo "\$ $*"; }
# not timed: the user's starting point, a model and a folder of images
cp ${QUANTUNE_ZOO_CACHE:-$HOME/.cache/quantune-zoo}/ppocr_cls/model.onnx .
$PY $REPO/bench/walkthrough/export_images.py images >/dev/null
echo "start: $(date -u +%H:%M:%S)"
T0=$(date +%s.%N)
step quantune init model.onnx --data images/
quantune init model.onnx --data images/
step "sed -i 's|/ 255.0  # EDIT.*|/ 255.0 * 2 - 1  # PaddleOCR: [-1, 1]|' data.py    # the model's normalisation"
sed -i 's|/ 255.0  # EDIT.*|/ 255.0 * 2 - 1  # PaddleOCR: [-1, 1]|' data.py
grep -n "PaddleOCR" data.py
step quantune check quantune.yaml
quantune check quantune.yaml
T1=$(date +%s.%N)
step quantune run quantune.yaml --set stop.max_trials=8 --quiet
quantune run quantune.yaml --set stop.max_trials=8 --quiet
T2=$(date +%s.%N)
echo
echo "end: $(date -u +%H:%M:%S)"
python3 -c "print(f'init -> check passed: {$T1-$T0:.0f} s; run: {$T2-$T1:.0f} s; init -> finished run: {$T2-$T0:.0f} s')"
