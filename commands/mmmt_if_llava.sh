#!/usr/bin/env bash
# MMMT-IF with LLaVA, the paper's setting: own answers as history, temperature 1, N=4 samples.
# Default data: an MMDU benchmark.json and image folder at data/mmdu (configs/datasets/mmmt_if.yaml).
# Quick run without MMDU (the release's questions, no images):
#   bash commands/mmmt_if_llava.sh --dataset_config mmmt_if_release_only --dataset_subsample 3
# (without MMDU, run_eval's one line says so: the hint lives with the MMMT-IF builder, one for every door)
# MODEL_NAME (or --model_name): a local checkpoint or an offline HF id (default: tiny, random
# weights). Answers are up to 256 new tokens (MAX_NEW_TOKENS), except with tiny: 16, because its
# 2,048-token context cannot hold a chat of 256-token answers and random weights never stop early.
set -euo pipefail
# shellcheck disable=SC1091
source "$(dirname "${BASH_SOURCE[0]}")/_python.sh"  # .venv (as demo.sh), PY, RUN (torchrun)
MODEL_NAME="${MODEL_NAME:-tiny}"
prev=""
for a in "$@"; do  # a --model_name given on the command line decides the default answer length
  case "$a" in --model_name=*) MODEL_NAME="${a#--model_name=}" ;; esac
  if [ "$prev" = "--model_name" ]; then MODEL_NAME="$a"; fi
  prev="$a"
done
if [ "$MODEL_NAME" = tiny ]; then DEFAULT_TOKENS=16; else DEFAULT_TOKENS=256; fi
"${RUN[@]}" run_eval.py \
  --model llava --model_name "$MODEL_NAME" \
  --dataset_name MMMT-IF --dataset_config configs/datasets/mmmt_if.yaml \
  --formulation Generation --infer_method generation --history model \
  --num_samples 4 --temperature 1.0 --max_new_tokens "${MAX_NEW_TOKENS:-$DEFAULT_TOKENS}" \
  --output_dir output/mmmt_if/llava --do_eval "$@"
