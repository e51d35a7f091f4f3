#!/usr/bin/env bash
# Set up .venv (see _setup.sh) and run the whole test suite on every core (pytest-xdist; the
# layout rules are in tests/conftest.py). CI runs exactly this. TEST_WORKERS=N sets the number
# of worker processes (default: one per core; 0 runs in this process, as pytest alone does).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck disable=SC1091
source "$ROOT/commands/_setup.sh"
cd "$ROOT"
# the report's browser test needs headless Chromium (Debian package); skipped quietly without apt
if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo -n"
  { $SUDO apt-get install -y -qq chromium || { $SUDO apt-get update -qq && $SUDO apt-get install -y -qq chromium; }; } \
    >/dev/null 2>&1 || true
fi
# the experiment-tracker extras, so their tests run against the real libraries (skipped without them)
python -c "import importlib.util as u, sys; sys.exit(not (u.find_spec('mlflow') and u.find_spec('wandb')))" \
  >/dev/null 2>&1 || python -m pip install -q "mlflow>=2.10" "wandb>=0.16" \
  >/dev/null 2>&1 || echo "note: mlflow/wandb not installed; their tests are skipped" >&2
export REFORM_CACHE="${REFORM_CACHE:-$ROOT/.cache/reform_eval}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
python -m pytest -q -p no:cacheprovider -n "${TEST_WORKERS:-auto}" --dist loadgroup --no-loadscope-reorder tests "$@"
