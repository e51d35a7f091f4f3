"""Benches that cannot rot (bench/README.md): every ``bench/*.py`` script answers ``--help``
without running or importing torch, and its ``--smoke`` run exits 0 with a last line that holds
every ``name=value`` key its docstring's ``Prints:`` paragraph names. Parametrised over the
folder, so a new bench is covered as soon as it is added."""
from __future__ import annotations

import ast
import glob
import json
import os
import re
import subprocess
import sys
from typing import Dict, List

import pytest

from tests.conftest import ROOT

BENCH = os.path.join(ROOT, "bench")
#: benches whose smoke run starts run_eval processes or builds models: tens of seconds
SLOW_SMOKE = {"threads", "cache", "known_skill", "overhead", "batching", "models", "likelihood", "report", "api_ceiling"}
#: benches of a real external engine: their smoke run needs that engine's venv (``engine`` tests:
#: skipped with one line where it cannot be built)
ENGINE_SMOKE = {"vllm_throughput"}


def _smoke_marks(script: str) -> list:
    if _name(script) in ENGINE_SMOKE:
        return [pytest.mark.engine, pytest.mark.slow]
    return [pytest.mark.slow] if _name(script) in SLOW_SMOKE else []


def _is_script(path: str) -> bool:
    with open(path, encoding="utf-8") as f:
        return 'if __name__ == "__main__":' in f.read()


SCRIPTS = sorted(p for p in glob.glob(os.path.join(BENCH, "*.py")) if _is_script(p))
HELPERS = sorted(p for p in glob.glob(os.path.join(BENCH, "*.py")) if not _is_script(p))


def _name(path: str) -> str:
    return os.path.basename(path)[:-3]


def printed_keys(path: str) -> List[str]:
    """The keys the docstring's ``Prints:`` paragraph names (``name=`` before a value)."""
    with open(path, encoding="utf-8") as f:
        doc = ast.get_docstring(ast.parse(f.read())) or ""
    m = re.search(r"^\s*Prints:(.*?)(?:\n\s*\n|\Z)", doc, re.S | re.M)
    assert m, f"{path}: the docstring has no 'Prints: name=... name=...' paragraph (bench/README.md)"
    keys = re.findall(r"(?<![\w<])([A-Za-z_]\w*)=", m.group(1))
    assert keys, f"{path}: the 'Prints:' paragraph names no key"
    return keys


def parse_line(line: str) -> Dict[str, str]:
    return dict(tok.split("=", 1) for tok in line.split() if "=" in tok)


def _env() -> Dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("REFORM_NO_CACHE", None)  # a bench decides its response cache itself
    return env


def test_bench_folder_has_scripts_and_every_helper_is_used() -> None:
    assert len(SCRIPTS) >= 10
    sources = "".join(open(p, encoding="utf-8").read() for p in SCRIPTS)
    for helper in HELPERS:
        assert re.search(rf"\b(?:from|import) (?:bench\.)?{_name(helper)}\b", sources), (
            f"{helper} has no __main__ block (so it is no bench) and no bench imports it")


def test_printed_keys_parse(tmp_path) -> None:
    path = tmp_path / "probe.py"
    path.write_text('"""X.\n\nPrints: a=<s> b_2=... ratio_<family>=...\n  c=1\n\nd=2\n"""\n')
    assert printed_keys(str(path)) == ["a", "b_2", "c"]
    assert parse_line("a=1 b=x=2 note") == {"a": "1", "b": "x=2"}


#: third-party packages a bench imports only inside the function that uses them (never at module
#: top), so that --help starts at once
HEAVY = {"torch", "transformers", "accelerate", "vllm", "matplotlib", "scipy", "mlflow", "wandb"}


def heavy_top_imports(path: str) -> List[str]:
    """Heavy packages imported by the module's top-level statements (``if``/``try`` blocks too)."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    found: List[str] = []
    todo = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.split(".")[0] in HEAVY]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in HEAVY:
            found.append(node.module)
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            todo += [n for n in ast.iter_child_nodes(node) if isinstance(n, ast.stmt)]
            todo += [n for h in getattr(node, "handlers", []) for n in h.body]
    return found


#: runs every script's ``--help`` in one interpreter (the library is imported once, not once per
#: script) and prints {script: [exit code, stdout]} as JSON
_HELP_PROBE = """
import contextlib, io, json, os, runpy, sys, traceback
found = {}
for script in sys.argv[1:]:
    sys.argv = [script, "--help"]
    sys.path.insert(0, os.path.dirname(script))  # as `python script` does
    buf = io.StringIO()
    code = "returned without exiting"
    with contextlib.redirect_stdout(buf):
        try:
            runpy.run_path(script, run_name="__main__")
        except SystemExit as e:
            code = e.code or 0
        except BaseException:
            code = traceback.format_exc()
    found[script] = [code, buf.getvalue()]
print(json.dumps(found))
"""


@pytest.fixture(scope="module")
def help_outputs() -> Dict[str, list]:
    done = subprocess.run([sys.executable, "-c", _HELP_PROBE, *SCRIPTS], cwd=ROOT, env=_env(), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("script", SCRIPTS, ids=_name)
def test_help_answers_without_running(script: str, help_outputs) -> None:
    """``--help`` exits 0 with the usage, ``--smoke`` in it and no result line; the script
    imports no heavy package at module top."""
    assert heavy_top_imports(script) == [], f"{script}: heavy imports at module top (bench/README.md)"
    code, out = help_outputs[script]
    assert code == 0, (code, out[-2000:])
    assert out.lstrip().startswith("usage:"), out[:500]
    assert "--smoke" in out, f"{script}: no --smoke option"
    keys = printed_keys(script)
    assert not any(re.search(rf"(?<!\w){k}=[-\d]", out) for k in keys), f"{script}: --help printed a result"


def test_heavy_top_imports_are_found(tmp_path) -> None:
    path = tmp_path / "probe.py"
    path.write_text("import os\nimport torch.nn\ntry:\n    from matplotlib import pyplot\nexcept ImportError:\n"
                    "    import scipy\ndef f():\n    import transformers\n")
    assert sorted(heavy_top_imports(str(path))) == ["matplotlib", "scipy", "torch.nn"]


@pytest.mark.spread
@pytest.mark.parametrize("script", [pytest.param(s, marks=_smoke_marks(s)) for s in SCRIPTS], ids=_name)
def test_smoke_run_prints_its_keys(script: str, tmp_path) -> None:
    if _name(script) in ENGINE_SMOKE:
        from tests.conftest import vllm_python
        vllm_python()
    done = subprocess.run([sys.executable, script, "--smoke"], cwd=str(tmp_path), env=_env(), capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    lines = done.stdout.strip().splitlines()
    assert lines, done.stderr[-2000:]
    got = parse_line(lines[-1])
    missing = [k for k in printed_keys(script) if k not in got]
    assert not missing, f"{script}: the last line lacks {missing}: {lines[-1]!r}"
    assert all(tok.count("=") >= 1 for tok in lines[-1].split()), f"not only name=value pairs: {lines[-1]!r}"
    assert os.listdir(tmp_path) == [], "a smoke run writes only to temporary folders"
