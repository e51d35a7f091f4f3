#!/usr/bin/env bash
# Shared set-up for demo.sh and test.sh: a .venv with torch==2.13.0 first (the CPU wheel on
# this kind of machine; a bare `torch` would pull a multi-GB CUDA build), then the project.
# Idempotent: a second run only checks that everything is installed.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
# shellcheck disable=SC1091
. .venv/bin/activate
python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
if ! python -c "import torch" >/dev/null 2>&1; then
  python -m pip install -q "torch==${TORCH_VERSION:-2.13.0}" 2>&1 | grep -v "^WARNING: Location" >&2 || true
  python -c "import torch" >/dev/null 2>&1 || { echo "error: torch==${TORCH_VERSION:-2.13.0} did not install" >&2; exit 1; }
fi
if ! python -c "import run_eval, build, transformers, pytest" >/dev/null 2>&1 || [ ! -f .venv/.project-installed ] || [ setup.py -nt .venv/.project-installed ] || [ requirements.txt -nt .venv/.project-installed ]; then
  # quiet: setuptools' banners go to a log, shown only if the install fails
  if ! python -m pip install -q -e ".[test]" >.venv/install.log 2>&1; then
    cat .venv/install.log >&2
    exit 1
  fi
  touch .venv/.project-installed
fi
