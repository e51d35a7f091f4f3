#!/usr/bin/env bash
# Shared set-up for demo.sh and test.sh: a .venv with torch==2.13.0 first (the CPU wheel on
# this kind of machine; a bare `torch` would pull a multi-GB CUDA build), then the project.
# Idempotent and fast when nothing changed: an installed venv is recognised by a stamp
# (.venv/.project-installed) holding a hash of setup.py, pyproject.toml, requirements.txt, this script, the
# venv's python binary and the torch version; when it matches, and the packages are still found
# (importlib's find_spec: nothing heavy is imported), nothing else runs (about 0.2 s instead of
# ~30 s of import checks). Any change of those inputs reinstalls. (Not the repository's path: a
# tree whose .venv links to this one, as the docs tests make, must not reinstall into it.)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
# shellcheck disable=SC1091
. .venv/bin/activate
_setup_key() {
  { cat setup.py pyproject.toml requirements.txt commands/_setup.sh "$(readlink -f .venv/bin/python)"
    printf '%s\n' "${TORCH_VERSION:-2.13.0}"; } | sha256sum | cut -c1-32
}
_setup_found() {  # the packages are still there (find_spec only: no import of torch or transformers)
  python -c "import importlib.util as u, sys; sys.exit(not all(map(u.find_spec, sys.argv[1:])))" \
    torch transformers pytest reform_eval >/dev/null 2>&1
}
_SETUP_KEY="$(_setup_key)"
if [ "$(cat .venv/.project-installed 2>/dev/null)" != "$_SETUP_KEY" ] || ! _setup_found; then
  python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
  if ! python -c "import torch" >/dev/null 2>&1; then
    python -m pip install -q "torch==${TORCH_VERSION:-2.13.0}" 2>&1 | grep -v "^WARNING: Location" >&2 || true
    python -c "import torch" >/dev/null 2>&1 || { echo "error: torch==${TORCH_VERSION:-2.13.0} did not install" >&2; exit 1; }
  fi
  # quiet: setuptools' banners go to a log, shown only if the install fails
  if ! python -m pip install -q -e ".[test]" >.venv/install.log 2>&1; then
    cat .venv/install.log >&2
    exit 1
  fi
  python -c "import reform_eval.run_eval, reform_eval.build, transformers, pytest" >/dev/null 2>&1 || {
    echo "error: the project installed but does not import; see .venv/install.log" >&2; exit 1; }
  echo "$_SETUP_KEY" > .venv/.project-installed
fi
unset -f _setup_key _setup_found
unset _SETUP_KEY
