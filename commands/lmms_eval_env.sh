#!/usr/bin/env bash
# A separate virtual environment with lmms-eval 0.7.3, to produce real lmms-eval logs that the
# harness then reads (the harness never imports lmms-eval; see docs/foreign_logs.md).
#
#   bash commands/lmms_eval_env.sh        # prints the environment's python on success
#
# Idempotent and cached: a second run only checks the marker and the import (about a second).
# Where: $LMMS_EVAL_VENV, default $REFORM_VENVS/lmms-eval-0.7.3 (REFORM_VENVS: default $REFORM_CACHE/venvs,
# the harness's one cache root, default ~/.cache/reform_eval; as commands/vllm_env.sh).
# torch is pinned to the project's version (the local CPU wheel), transformers to the project's
# .venv version when there is one, so both tools run the same model code. On failure: one line
# on stderr naming the step and the log file, exit 1.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VERSION="0.7.3"
VENVS="${REFORM_VENVS:-${REFORM_CACHE:-$HOME/.cache/reform_eval}/venvs}"
VENVS="${VENVS/#\~/$HOME}"
VENV="${LMMS_EVAL_VENV:-$VENVS/lmms-eval-$VERSION}"
PYTHON="${PYTHON:-python3}"
MARK="$VENV/.lmms-eval-ok"
LOG="$VENV.install.log"

if [ -f "$MARK" ] && "$VENV/bin/python" -c "import lmms_eval, decord, filelock._api" >/dev/null 2>&1; then
  echo "$VENV/bin/python"
  exit 0
fi

fail() { echo "error: lmms-eval $VERSION environment: $1 failed (log: $LOG)" >&2; exit 1; }

mkdir -p "$(dirname "$VENV")"
: >"$LOG"
if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV" >>"$LOG" 2>&1 || fail "creating the virtual environment"
fi
PIP=("$VENV/bin/python" -m pip install --disable-pip-version-check --prefer-binary)
# the project's versions where it has a .venv (same model code on both sides), else the tested ones
TRANSFORMERS="$("$ROOT/.venv/bin/python" -c 'import transformers; print(transformers.__version__)' 2>/dev/null || echo 5.24.0)"
TORCH="${TORCH_VERSION:-2.13.0}"
"${PIP[@]}" "torch==$TORCH" >>"$LOG" 2>&1 || fail "installing torch==$TORCH"
# decord: llava_hf imports it at module top (video frames) although lmms-eval does not require it
# filelock<4: lmms-eval 0.7.3 imports filelock._api (gone in filelock 4)
"${PIP[@]}" "lmms-eval==$VERSION" "torch==$TORCH" "transformers==$TRANSFORMERS" decord "filelock<4" >>"$LOG" 2>&1 \
  || fail "installing lmms-eval==$VERSION with transformers==$TRANSFORMERS"
# PyPI's torchvision wheels are CUDA builds: next to the CPU torch wheel they fail to load
# ("operator torchvision::nms does not exist") and take transformers' AutoProcessor down with them.
# Without torchvision, transformers uses the PIL image processors, as the project's .venv does.
if [ "${LMMS_EVAL_KEEP_TORCHVISION:-0}" != 1 ]; then
  "$VENV/bin/python" -m pip uninstall -y torchvision >>"$LOG" 2>&1 || fail "removing torchvision"
fi
"$VENV/bin/python" -c "import lmms_eval, decord, filelock._api; from lmms_eval.models.simple.llava_hf import LlavaHf" >>"$LOG" 2>&1 \
  || fail "importing lmms_eval and its llava_hf model"
"$VENV/bin/python" -m pip freeze >"$VENV/.freeze.txt" 2>>"$LOG"
echo "lmms-eval==$VERSION torch==$TORCH transformers==$TRANSFORMERS" >"$MARK"
echo "$VENV/bin/python"
