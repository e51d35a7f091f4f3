#!/usr/bin/env bash
# MME with LLaVA: set root in configs/datasets/mme.yaml (or pass --dataset_option root=/path/to/MME).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
torchrun --standalone --nproc_per_node="${NPROC:-1}" run_eval.py \
  --model llava --model_name "${MODEL_NAME:-tiny}" \
  --dataset_name MME --dataset_config configs/datasets/mme.yaml \
  --formulation Generation --infer_method generation --max_new_tokens 8 \
  --per_gpu_eval_batch_size 4 --output_dir output/mme/llava --do_eval "$@"
