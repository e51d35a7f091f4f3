#!/usr/bin/env bash
# MMMT-IF with LLaVA, the paper's setting: own answers as history, temperature 1, N=4 samples.
# Point the config at an MMDU benchmark.json and its image folder first.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
torchrun --standalone --nproc_per_node="${NPROC:-1}" run_eval.py \
  --model llava --model_name "${MODEL_NAME:-tiny}" \
  --dataset_name MMMT-IF --dataset_config configs/datasets/mmmt_if.yaml \
  --formulation Generation --infer_method generation --history model \
  --num_samples 4 --temperature 1.0 --max_new_tokens 256 \
  --output_dir output/mmmt_if/llava --do_eval "$@"
