#!/usr/bin/env bash
# Sourced by the per-benchmark scripts: the Python they run and their launcher, in one place.
# The repository's .venv, set up (or only checked) by _setup.sh as demo.sh does, so a script works
# right after the demo without activating anything; without a .venv, a `python` on PATH that already
# has torch and transformers (an environment of your own) is used as it is. With NPROC > 1 the
# launcher is torchrun from that Python (python -m torch.distributed.run), never a `torchrun` found
# elsewhere on PATH; one process (the default) is plain python.
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ -x "$ROOT/.venv/bin/python" ] || ! python -c "import importlib.util as u, sys
sys.exit(not all(map(u.find_spec, sys.argv[1:])))" torch transformers >/dev/null 2>&1; then
  # shellcheck disable=SC1091
  source "$ROOT/commands/_setup.sh"
fi
cd "$ROOT"
# the tiny models the demo built are found again: one cache root for every entry point
# ($REFORM_CACHE, else ~/.cache/reform_eval: utils/paths.py), as for run_eval run directly
export TOKENIZERS_PARALLELISM=false
PY=python
if [ "${NPROC:-1}" -gt 1 ]; then
  # torchrun otherwise sets OMP_NUM_THREADS=1 with a banner on every run; this is its value
  # spelled out where the user can see and change it (cores shared among the ranks)
  export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$(( $(nproc) / NPROC > 0 ? $(nproc) / NPROC : 1 ))}"
  RUN=("$PY" -m torch.distributed.run --standalone --nproc_per_node="$NPROC")
else
  # one process needs no launcher: an error is run_eval's one line, not a launcher traceback
  RUN=("$PY")
fi
