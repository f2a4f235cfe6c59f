#!/usr/bin/env bash
# Creates the bench's venvs under $QUANTUNE_BENCH_CACHE (default ~/.cache/quantune-bench):
#   bench/setup.sh build                 the build venv (torch 2.13.0 CPU, MiniLM, gensim)
#   bench/setup.sh inc nncf olive quark  one venv per peer, so no peer's dependencies reach quantune's
# A venv that already has its requirements installed is left alone. A peer that fails to
# install is reported and skipped (the bench then prints "not installed" in its row).
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cache="${QUANTUNE_BENCH_CACHE:-$HOME/.cache/quantune-bench}"
python="${PYTHON:-python3}"
mkdir -p "$cache"
status=0
for name in "$@"; do
  venv="$cache/venv-$name"
  req="$here/requirements/$name.txt"
  [ -f "$req" ] || { echo "setup.sh: no requirements file $req" >&2; exit 2; }
  stamp="$venv/.installed-$(sha1sum "$req" | cut -c1-12)"
  if [ -f "$stamp" ]; then echo "setup.sh: $name: up to date ($venv)"; continue; fi
  echo "setup.sh: $name: installing into $venv (log: $cache/install-$name.log)"
  [ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
  if "$venv/bin/python" -m pip install --quiet --upgrade pip >"$cache/install-$name.log" 2>&1 &&
     "$venv/bin/python" -m pip install --quiet -r "$req" >>"$cache/install-$name.log" 2>&1; then
    touch "$stamp"
  else
    echo "setup.sh: $name: install FAILED, see $cache/install-$name.log" >&2
    status=1
  fi
done
exit $status
