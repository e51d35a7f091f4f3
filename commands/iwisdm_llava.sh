#!/usr/bin/env bash
# iWISDM (high complexity) with LLaVA on N processes. MODEL_NAME: a local checkpoint path or an
# offline HF id (default: the tiny random-weight model). Usage: NPROC=2 bash commands/iwisdm_llava.sh
set -euo pipefail
# shellcheck disable=SC1091
source "$(dirname "${BASH_SOURCE[0]}")/_python.sh"  # .venv (as demo.sh), PY, RUN (torchrun)
"${RUN[@]}" run_eval.py \
  --model llava --model_name "${MODEL_NAME:-tiny}" \
  --dataset_name iWISDM --dataset_config configs/datasets/iwisdm_high.yaml \
  --formulation Generation --infer_method generation --max_new_tokens 10 \
  --per_gpu_eval_batch_size 4 --output_dir output/iwisdm_high/llava --do_eval "$@"
