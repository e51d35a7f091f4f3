#!/usr/bin/env bash
# Set up .venv and run the main job end to end: tiny LLaVA (random weights, built offline)
# on generated iWISDM trials, beside the random baseline for chance level, printing the
# metrics tables. Extra arguments go to both run_eval calls.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck disable=SC1091
source "$ROOT/commands/_setup.sh"
cd "$ROOT"
export REFORM_CACHE="${REFORM_CACHE:-$ROOT/.cache/reform_eval}" HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
OUT="${OUT:-$ROOT/output/demo}"
COMMON=(--dataset_name iWISDM --dataset_config configs/datasets/iwisdm_low.yaml --formulation SingleChoice
        --dataset_subsample 40 --do_eval --overwrite "$@")
echo "== tiny LLaVA, iWISDM low, SingleChoice, likelihood =="
python run_eval.py --model llava --model_name tiny --infer_method likelihood --per_gpu_eval_batch_size 4 \
  --output_dir "$OUT/llava_likelihood" "${COMMON[@]}"
echo "== tiny LLaVA, iWISDM low, SingleChoice, generation =="
python run_eval.py --model llava --model_name tiny --infer_method generation --per_gpu_eval_batch_size 4 \
  --max_new_tokens 8 --output_dir "$OUT/llava_generation" "${COMMON[@]}"
echo "== random baseline (chance level) =="
python run_eval.py --model random --output_dir "$OUT/random" "${COMMON[@]}"
echo "Outputs under $OUT"
