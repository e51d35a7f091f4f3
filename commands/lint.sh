#!/usr/bin/env bash
# The static checks, with the versions pinned in setup.py's `test` extra (what CI runs before the
# tests, .ci/run): ruff over every Python file of the repository (sources, tests, bench) and mypy
# over the package reform_eval and the two root scripts. Both run; either one's finding fails it; the
# settings are in pyproject.toml. Uses .venv's Python where there is one (commands/test.sh or
# demo.sh make it; this script installs nothing), else `python` on PATH.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY=python
[ -x .venv/bin/python ] && PY=.venv/bin/python
echo "ruff: $("$PY" -m ruff --version)"
rc=0
"$PY" -m ruff check --no-cache . || rc=1
# mypy names a module after its folders, and here the folders become subpackages of reform_eval
# only at run time (reform_eval/__init__.py): check a tree of links with the installed layout,
# kept beside mypy's cache (its path is stable, so the cache stays valid), and print the findings
# under the repository's own paths. The subpackages are reform_eval/__init__.py's SUBPACKAGES (one list).
SUBS="$("$PY" -c 'import ast
tree = ast.parse(open("reform_eval/__init__.py", encoding="utf-8").read())
subs = next(ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
            and getattr(n.targets[0], "id", "") == "SUBPACKAGES")
print(" ".join(subs))')"
TREE=.mypy_cache/tree/reform_eval
rm -rf "$TREE" && mkdir -p "$TREE"
for f in reform_eval/*.py; do ln -s "../../../$f" "$TREE/"; done
for sub in $SUBS; do ln -s "../../../$sub" "$TREE/$sub"; done
echo "mypy: $("$PY" -m mypy --version)"
"$PY" -m mypy "$TREE" run_eval.py run_loader_eval.py 2>&1 \
  | sed -E "s#^$TREE/(($(echo $SUBS | tr ' ' '|'))/)#\\1#; s#^$TREE/#reform_eval/#" || rc=1
exit "$rc"
