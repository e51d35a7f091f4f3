#!/usr/bin/env bash
# Sourced by the per-benchmark scripts: the Python they run and their launcher, in one place.
# The repository's .venv, set up (or only checked) by _setup.sh as demo.sh does, so a script works
# right after the demo without activating anything; without a .venv, a `python` on PATH that already
# has torch and transformers (an environment of your own) is used as it is. The launcher is torchrun
# from that Python (python -m torch.distributed.run), never a `torchrun` found elsewhere on PATH.
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ -x "$ROOT/.venv/bin/python" ] || ! python -c "import torch, transformers" >/dev/null 2>&1; then
  # shellcheck disable=SC1091
  source "$ROOT/commands/_setup.sh"
fi
cd "$ROOT"
# the tiny models the demo built are found again (same default cache as demo.sh)
export REFORM_CACHE="${REFORM_CACHE:-$ROOT/.cache/reform_eval}" TOKENIZERS_PARALLELISM=false
PY=python
RUN=("$PY" -m torch.distributed.run --standalone --nproc_per_node="${NPROC:-1}")
