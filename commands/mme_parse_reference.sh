#!/usr/bin/env bash
# The exact command that made tests/data/mme_parse_stress/expected.json: every response of the
# stress set (tests/data/mme_parse_stress/responses.json) read by the other harnesses' OWN answer
# functions, so tests/test_mme_parse_reference.py can check that our implementations of their rules
# (metrics/mme.py: parse_vlmevalkit, parse_stripped) read every response as theirs do.
#
#   bash commands/mme_parse_reference.sh VLMEVALKIT_GIT_DIR [OUT]
#
# VLMEVALKIT_GIT_DIR: a clone of https://github.com/open-compass/VLMEvalKit (bare or not); its commit
# $VLMEVALKIT_COMMIT is read with `git show`, nothing is checked out or installed. lmms-eval: its
# wheel $LMMS_EVAL_VERSION from PyPI (`pip download --no-deps`; nothing installed). From each source
# the named functions are taken verbatim (Python's ast, by name; their text is hashed into the output)
# and executed here, in this Python, without the rest of either tool:
#   VLMEvalKit  vlmeval/smp/misc.py process_punctuation, vlmeval/dataset/utils/yorn.py YOrN_Extraction
#               (its evaluate() applies YOrN_Extraction to str(prediction); 'Unknown' counts wrong)
#   lmms-eval   lmms_eval/tasks/mme/utils.py parse_pred_ans
# Nothing of either tool is written into the repository but their outputs.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SRC="${1:?usage: bash commands/mme_parse_reference.sh VLMEVALKIT_GIT_DIR [OUT]}"
OUT="${2:-$ROOT/tests/data/mme_parse_stress/expected.json}"
VLMEVALKIT_COMMIT="${VLMEVALKIT_COMMIT:-e8e78f05f3080fe28154f2130321f17951c3be94}"
LMMS_EVAL_VERSION="${LMMS_EVAL_VERSION:-0.7.3}"
PY="${PY:-$ROOT/.venv/bin/python}"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/mme_parse_reference.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
"$PY" -m pip download --quiet --disable-pip-version-check --no-deps "lmms-eval==$LMMS_EVAL_VERSION" -d "$WORK" >/dev/null
WHEEL="$(ls "$WORK"/lmms_eval-"$LMMS_EVAL_VERSION"-*.whl)"
git -C "$SRC" show "$VLMEVALKIT_COMMIT:vlmeval/smp/misc.py" >"$WORK/misc.py"
git -C "$SRC" show "$VLMEVALKIT_COMMIT:vlmeval/dataset/utils/yorn.py" >"$WORK/yorn.py"
"$PY" - "$ROOT/tests/data/mme_parse_stress/responses.json" "$OUT" "$WORK" "$WHEEL" "$VLMEVALKIT_COMMIT" \
  "$LMMS_EVAL_VERSION" <<'EOF'
import ast, hashlib, json, os, platform, sys, unicodedata, zipfile

responses_path, out, work, wheel, commit, version = sys.argv[1:]


def functions(source, names):
    """The named top-level functions of a module's source, verbatim, and their sha256."""
    tree = ast.parse(source)
    found = {n.name: ast.get_source_segment(source, n) for n in tree.body
             if isinstance(n, ast.FunctionDef) and n.name in names}
    missing = set(names) - set(found)
    if missing:
        sys.exit(f"error: {sorted(missing)} not found")
    return {n: (found[n], hashlib.sha256(found[n].encode()).hexdigest()) for n in names}


def read(path):
    return open(path, encoding="utf-8").read()


vlm = {**functions(read(os.path.join(work, "misc.py")), ["process_punctuation"]),
       **functions(read(os.path.join(work, "yorn.py")), ["YOrN_Extraction"])}
with zipfile.ZipFile(wheel) as z:
    lmms = functions(z.read("lmms_eval/tasks/mme/utils.py").decode("utf-8"), ["parse_pred_ans"])
ns_v, ns_l = {}, {}
for text, _ in vlm.values():
    exec(text, ns_v)
exec(lmms["parse_pred_ans"][0], ns_l)
data = json.load(open(responses_path, encoding="utf-8"))
cases = []
for item in data["responses"]:
    r = item["response"]
    # VLMEvalKit's evaluate(): YOrN_Extraction(str(prediction)); lmms-eval's process_results: parse_pred_ans(pred)
    cases.append({"response": r, "vlmevalkit": ns_v["YOrN_Extraction"](str(r)), "lmms_eval": ns_l["parse_pred_ans"](r)})
result = {
    "recipe": "bash commands/mme_parse_reference.sh VLMEVALKIT_GIT_DIR",
    "vlmevalkit": {"repository": "https://github.com/open-compass/VLMEvalKit", "commit": commit,
                   "functions": {"vlmeval/smp/misc.py": "process_punctuation",
                                 "vlmeval/dataset/utils/yorn.py": "YOrN_Extraction"},
                   "function_sha256": {n: h for n, (_, h) in vlm.items()},
                   "outputs": "Yes / No / Unknown"},
    "lmms_eval": {"package": f"lmms-eval=={version}", "wheel": os.path.basename(wheel),
                  "wheel_sha256": hashlib.sha256(open(wheel, "rb").read()).hexdigest(),
                  "functions": {"lmms_eval/tasks/mme/utils.py": "parse_pred_ans"},
                  "function_sha256": {n: h for n, (_, h) in lmms.items()}, "outputs": "yes / no / other"},
    "python": platform.python_version(), "unicode": unicodedata.unidata_version,
    "cases": cases,
}
tmp = out + ".tmp"
with open(tmp, "w", encoding="utf-8") as f:
    json.dump(result, f, ensure_ascii=True, indent=1)
    f.write("\n")
os.replace(tmp, out)
print(f"{out}: {len(cases)} responses")
EOF
