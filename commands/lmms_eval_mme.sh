#!/usr/bin/env bash
# lmms-eval 0.7.3 and this harness, side by side on the same checkpoint and MME-format data: the
# exact command that made the committed fixture tests/data/lmms_eval_mme/ (tests/test_foreign_logs.py).
#
#   bash commands/lmms_eval_mme.sh [OUT]      # default OUT: tests/data/lmms_eval_mme
#
# Re-run it whenever models/checkpoints/llava-tiny-trained changes (the tests compare the
# checkpoint's SHA-256 with the one in OUT/MANIFEST.json and name this command when they differ).
# Data: python -m reform_eval.build.mme_synthetic (existence + color, $IMAGES images each, seed $SEED), the
# release folder for our runs and the same files as a parquet in the HF MME layout for lmms-eval,
# whose mme task is pointed at it by a task YAML that includes lmms-eval's own mme.yaml.
# lmms-eval runs (its own venv, commands/lmms_eval_env.sh; --log_samples):
#   default  llava_hf as 0.7.3 resolves it (its chat class: the checkpoint's chat template), the
#            task's own prompt ("\nAnswer the question using a single word or phrase.")
#   matched  the same with post_prompt "" (the released question, " Please answer yes or no.")
#   vicuna   --force_simple llava_hf with chat_template = lmms-eval's VICUNA_CHAT_TEMPLATE (the
#            template its simple llava_hf applies to a checkpoint whose tokenizer has none; its
#            system line written as a Jinja literal so --model_args keeps its commas), post_prompt ""
# Our runs (run_eval, llava tiny-trained, 16 new tokens, greedy):
#   ours_lmms_prompt  prompt lmms_eval;  ours  prompt official;  ours_vicuna  official, preprocessor=conv
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="$(mkdir -p "${1:-$ROOT/tests/data/lmms_eval_mme}" && cd "${1:-$ROOT/tests/data/lmms_eval_mme}" && pwd)"
IMAGES="${IMAGES:-20}"
SEED="${SEED:-0}"
CKPT="$ROOT/models/checkpoints/llava-tiny-trained"
PY="$ROOT/.venv/bin/python"
[ -x "$PY" ] || bash "$ROOT/commands/_setup.sh"
LPY="$(bash "$ROOT/commands/lmms_eval_env.sh")" || exit 1
WORK="$(mktemp -d "${TMPDIR:-/tmp}/lmms_eval_mme.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export HF_HOME="$WORK/hf" REFORM_CACHE="${REFORM_CACHE:-$ROOT/.cache/reform_eval}"
# lmms-eval names its version by `git describe` run from its package folder: stop git at the
# environment's parent, or it reports the git revision of this repository (the venv lies in it)
export GIT_CEILING_DIRECTORIES="$(dirname "$(dirname "$(dirname "$LPY")")")"
cd "$ROOT"

"$PY" -m reform_eval.build.mme_synthetic --out "$WORK/release" --images "$IMAGES" --seed "$SEED" >/dev/null
"$PY" -c "import sys; from reform_eval.build.mme import write_placeholder_parquet as w; w(sys.argv[1], sys.argv[2], ['existence', 'color'])" \
  "$WORK/release" "$WORK/parquet/test.parquet"
MME_YAML="$("$LPY" -c 'import lmms_eval, os; print(os.path.join(os.path.dirname(lmms_eval.__file__), "tasks", "mme", "mme.yaml"))' 2>/dev/null)"

task_yaml() {  # $1 folder, $2 post_prompt line (empty: lmms-eval's own)
  mkdir -p "$1"
  { echo "include: $MME_YAML"; echo "task: mme_local"; echo "dataset_path: parquet"
    echo "dataset_kwargs:"; echo "  data_files:"; echo "    test: $WORK/parquet/test.parquet"
    if [ -n "$2" ]; then echo "lmms_eval_specific_kwargs:"; echo "  default:"; echo '    pre_prompt: ""'; echo "    post_prompt: $2"; fi
  } >"$1/mme_local.yaml"
}
VICUNA='{% for message in messages %}{% if loop.index0 == 0 %}{{ "A chat between a curious user and an artificial intelligence assistant. The assistant gives helpful, detailed, and polite answers to the user'"'"'s questions. USER: " }}{{ message['"'"'content'"'"'] }} {% elif message['"'"'role'"'"'] == '"'"'user'"'"' %}USER: {{ message['"'"'content'"'"'] }} {% else %} ASSISTANT: {{ message['"'"'content'"'"'] }}{{ eos_token }}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '"'"'ASSISTANT:'"'"' }}{% endif %}'

lmms() {  # $1 name, $2 post_prompt ("" = the task's own), $3 extra model args, $4 extra flags
  local name="$1"
  task_yaml "$WORK/tasks_$name" "$2"
  # a task of its own name: lmms-eval prefers its built-in mme (the hub) over an include_path twin
  (cd "$WORK" && "$LPY" -m lmms_eval --model llava_hf \
      --model_args "pretrained=$CKPT,device=cpu,device_map=cpu${3}" $4 --tasks mme_local \
      --include_path "$WORK/tasks_$name" --batch_size 1 --log_samples --output_path "$WORK/lmms_$name" \
      --verbosity WARNING >"$WORK/lmms_$name.log" 2>&1) \
    || true  # lmms-eval exits 0 after logging an error: its files tell whether it ran
  if [ -z "$(find "$WORK/lmms_$name" -name '*_samples_mme_local.jsonl' 2>/dev/null)" ]; then
    grep -v '^\s*$' "$WORK/lmms_$name.log" | tail -5 >&2
    echo "error: lmms-eval run '$name' wrote no samples (log above)" >&2
    exit 1
  fi
  rm -rf "${OUT:?}/$name" && mkdir -p "$OUT/$name"
  find "$WORK/lmms_$name" -name '*_samples_mme_local.jsonl' -exec cp {} "$OUT/$name/" \;
  find "$WORK/lmms_$name" -name '*_results.json' -exec cp {} "$OUT/$name/" \;
}
lmms default "" "" ""
lmms matched '""' "" ""
lmms vicuna '""' ",chat_template=$VICUNA" "--force_simple"

ours() {  # $1 name, $2 prompt, further args: run_eval flags
  local name="$1" prompt="$2"; shift 2
  "$PY" run_eval.py --model llava --model_name tiny-trained --dataset_name MME \
    --dataset_option "root=$WORK/release" --dataset_option subtasks=existence,color \
    --dataset_option check_counts=false --dataset_option "prompt=$prompt" \
    --formulation Generation --infer_method generation --max_new_tokens 16 \
    --output_dir "$WORK/ours_$name" "$@" >"$WORK/ours_$name.log" 2>&1 \
    || { tail -5 "$WORK/ours_$name.log" >&2; echo "error: our run '$name' failed" >&2; exit 1; }
  "$PY" - "$WORK/ours_$name" "$OUT/$name.json" <<'EOF'
import glob, json, os, sys
src = [p for p in glob.glob(os.path.join(sys.argv[1], "MME_*.json")) if not p.endswith((".results.json", ".run.json"))]
records = json.load(open(src[0], encoding="utf-8"))
for r in records:  # the data folder was temporary: keep names, not its paths
    r["image_ids"] = [os.path.basename(p) for p in r.get("image_ids") or []]
    (r.get("meta") or {})["source_file"] = os.path.basename((r.get("meta") or {}).get("source_file") or "")
json.dump(records, open(sys.argv[2], "w", encoding="utf-8"), ensure_ascii=False, indent=0)
EOF
}
ours ours_lmms_prompt lmms_eval
ours ours official
ours ours_vicuna official --model_option preprocessor=conv

"$PY" - "$OUT" "$CKPT" "$LPY" "$IMAGES" "$SEED" <<'EOF'
import hashlib, json, os, subprocess, sys
out, ckpt, lpy, images, seed = sys.argv[1:]
sha = {n: hashlib.sha256(open(os.path.join(ckpt, n), "rb").read()).hexdigest() for n in sorted(os.listdir(ckpt))}
ver = lambda py, mod: subprocess.run([py, "-c", f"import importlib.metadata as m; print(m.version('{mod}'))"],
                                     capture_output=True, text=True).stdout.strip() or None
manifest = {"command": "bash commands/lmms_eval_mme.sh", "checkpoint": "models/checkpoints/llava-tiny-trained",
            "checkpoint_sha256": sha, "data": {"generator": "python -m reform_eval.build.mme_synthetic", "images": int(images),
                                               "seed": int(seed), "subtasks": ["existence", "color"]},
            "versions": {"lmms-eval": ver(lpy, "lmms-eval"), "transformers (lmms-eval venv)": ver(lpy, "transformers"),
                         "torch (lmms-eval venv)": ver(lpy, "torch"), "transformers (ours)": ver(sys.executable, "transformers"),
                         "torch (ours)": ver(sys.executable, "torch")}}
json.dump(manifest, open(os.path.join(out, "MANIFEST.json"), "w"), indent=1)
EOF
echo "$OUT"
