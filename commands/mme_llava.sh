#!/usr/bin/env bash
# MME with LLaVA (official protocol: Generation, yes/no parsed by the official rule).
# Data: the official release at data/MME_Benchmark_release_version (or pass
# --dataset_option root=/path/to/MME, or --dataset_config configs/datasets/mme_parquet.yaml).
# Without it, a placeholder copy (the official question lists shipped in
# configs/data/mme_questions, 8x8 blank images) is written to output/mme/placeholder_release
# (MME_PLACEHOLDER to change it) so
# the pipeline runs end to end: its scores are NOT MME scores (a warning says so).
# MODEL_NAME (or --model_name): a local checkpoint or an offline HF id (default: tiny, random weights).
# Usage: bash commands/mme_llava.sh [run_eval options, e.g. --dataset_subsample 20]
set -euo pipefail
# shellcheck disable=SC1091
source "$(dirname "${BASH_SOURCE[0]}")/_python.sh"  # .venv (as demo.sh), PY, RUN (torchrun)
DATA=()
if [ ! -d data/MME_Benchmark_release_version ] && ! printf '%s\n' "$@" | grep -qE '^(root|parquet)=|^--dataset_config'; then
  PLACEHOLDER="${MME_PLACEHOLDER:-$PWD/output/mme/placeholder_release}"
  if [ ! -d "$PLACEHOLDER" ]; then
    "$PY" -m reform_eval.build.mme_placeholder --questions configs/data/mme_questions --out "$PLACEHOLDER" >/dev/null
  fi
  echo "warning: no MME release at data/MME_Benchmark_release_version; running on placeholder images" \
       "($PLACEHOLDER): these scores are not MME scores" >&2
  DATA=(--dataset_option "root=$PLACEHOLDER")
fi
"${RUN[@]}" run_eval.py \
  --model llava --model_name "${MODEL_NAME:-tiny}" \
  --dataset_name MME --dataset_config configs/datasets/mme.yaml ${DATA[@]+"${DATA[@]}"} \
  --formulation Generation --infer_method generation --max_new_tokens 8 \
  --per_gpu_eval_batch_size 4 --output_dir output/mme/llava --do_eval "$@"
