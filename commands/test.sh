#!/usr/bin/env bash
# Set up .venv (see _setup.sh) and run the whole test suite on every core (pytest-xdist; the
# layout rules are in tests/conftest.py). It installs into the repository's .venv and nowhere
# else: the browser the report tests use is a system package, installed only by .ci/run (or
# `bash commands/install_browser.sh`); without it those tests skip with one line saying so. TEST_WORKERS=N sets the number
# of worker processes (default: one per core; 0 runs in this process, as pytest alone does).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck disable=SC1091
source "$ROOT/commands/_setup.sh"
cd "$ROOT"
# the engines' venvs (gigabytes, built once per machine) stay under the machine's cache root; the
# tests' own cache (tiny models, responses) goes into the clone
export REFORM_VENVS="${REFORM_VENVS:-${REFORM_CACHE:-$HOME/.cache/reform_eval}/venvs}"
export REFORM_CACHE="${REFORM_CACHE:-$ROOT/.cache/reform_eval}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# bytecode is cached for this run (in the clone's __pycache__ folders, which git ignores): with
# PYTHONDONTWRITEBYTECODE=1 in the environment (some sandboxes and CI images set it) each of the
# hundreds of command lines the tests start compiled the project again (0.35 s of CPU each, for
# run_eval --help alone) and every test worker rewrote every test module
unset PYTHONDONTWRITEBYTECODE
python -m pytest -q -p no:cacheprovider -n "${TEST_WORKERS:-auto}" --dist loadgroup --no-loadscope-reorder tests "$@"
