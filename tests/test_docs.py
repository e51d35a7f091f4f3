"""Every command and snippet in README.md and docs/ works as written.

Each fenced ``bash`` and ``python`` block is executed from a scratch copy of the repository
layout (top-level entries linked, so outputs land in the scratch directory). A block fenced
``bash norun`` / ``python norun`` needs something this machine cannot have (real weights, a
GPU, a cluster, a server) and is only checked to name real files and flags. A block fenced
``bash engine`` needs the vLLM engine: it runs (marked ``engine``) where the vLLM venv of
``commands/vllm_env.sh`` is built or can be, is skipped with that script's one line where it
cannot, and is checked like a ``norun`` block either way. Substitutions keep
runs small, as the docs promise they work on any checkpoint and dataset size:

* ``--model_name <path that does not exist>`` -> ``--model_name tiny`` (the random tiny model
  of the same architecture);
* every ``run_eval.py`` command, and every ``commands/*.sh`` script (they pass their
  arguments on to run_eval), gets ``--dataset_subsample 3 --max_new_tokens 4`` unless it sets
  them;
* ``python`` is this interpreter; ``torchrun`` is ``python -m torch.distributed.run``.
"""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from typing import List, Tuple

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = ["README.md"] + sorted(os.path.join("docs", n) for n in os.listdir(os.path.join(ROOT, "docs"))
                              if n.endswith(".md"))
FENCE = re.compile(r"^```([A-Za-z]+)?(?:[ \t]+([A-Za-z-]+))?[ \t]*$")


def blocks() -> List[Tuple[str, int, str, str, str]]:
    """(file, line, language, flag, code) of every fenced bash/python block."""
    out = []
    for doc in DOCS:
        lines = open(os.path.join(ROOT, doc), encoding="utf-8").read().splitlines()
        i = 0
        while i < len(lines):
            m = FENCE.match(lines[i])
            if m and m.group(1):
                start, lang, flag = i + 1, m.group(1), m.group(2) or ""
                j = i + 1
                while j < len(lines) and not lines[j].startswith("```"):
                    j += 1
                if lang in ("bash", "python"):
                    out.append((doc, start, lang, flag, "\n".join(lines[i + 1:j])))
                i = j + 1
            else:
                i += 1
    return out


ALL = blocks()
#: blocks that run a model (the tiny LLaVA: every commands/ script defaults to it) are slow
SLOW_MARKERS = ("commands/", "--model_name tiny", "compare_runs", "get_model(")


def scratch_tree(tmp_path) -> str:
    """A directory whose top-level entries link to the repository's (outputs stay in it)."""
    work = tmp_path / "work"
    work.mkdir()
    for name in os.listdir(ROOT):
        if name in (".git", "output", ".pytest_cache"):
            continue
        os.symlink(os.path.join(ROOT, name), work / name)
    return str(work)


def adapt_bash(code: str, work: str) -> str:
    """Apply the substitutions above to a bash block."""
    code = code.replace("\\\n", " ")
    lines = []
    for line in code.splitlines():
        body = line.split("#", 1)[0] if not line.lstrip().startswith("#") else ""
        m = re.search(r"--model_name\s+(\S+)", body)
        if m and m.group(1) != "tiny" and os.sep in m.group(1) and not os.path.exists(m.group(1)):
            body = body.replace(m.group(0), "--model_name tiny")
        if ("run_eval.py" in body or re.search(r"(^|\s)run_eval\s", body)
                or re.search(r"\bcommands/(?:\w+_llava|demo)\.sh\b", body)):
            if "--dataset_subsample" not in body:
                body += " --dataset_subsample 3"
            if "--max_new_tokens" not in body:
                body += " --max_new_tokens 4"
        lines.append(body)
    py = shlex.quote(sys.executable)
    prelude = (f"set -euo pipefail\ncd {shlex.quote(work)}\n"
               f"python() {{ {py} \"$@\"; }}\ntorchrun() {{ {py} -m torch.distributed.run \"$@\"; }}\n"
               "export -f python torchrun\n")
    return prelude + "\n".join(lines)


def _id(b):
    return f"{b[0]}:{b[1]}"


def _runnable():
    """Runnable blocks; those that run a model are marked slow (the quick subset skips them),
    those that need the vLLM engine are marked engine and slow."""
    def marks(b):
        if b[3] == "engine":
            return [pytest.mark.engine, pytest.mark.slow]
        return [pytest.mark.slow] if any(m in b[4] for m in SLOW_MARKERS) else []
    return [pytest.param(b, id=_id(b), marks=marks(b)) for b in ALL if b[3] != "norun"]


def _engine_available() -> None:
    """Skip (one line) unless the vLLM venv is built or can be built (commands/vllm_env.sh)."""
    from tests.conftest import vllm_python
    vllm_python()


@pytest.mark.spread
@pytest.mark.parametrize("block", _runnable())
def test_documented_block_runs(block, tmp_path):
    doc, line, lang, flag, code = block
    if flag == "engine":
        _engine_available()
    work = scratch_tree(tmp_path)
    env = dict(os.environ, PYTHONPATH=work, OMP_NUM_THREADS="1", MPLBACKEND="Agg")
    if lang == "bash":
        proc = subprocess.run(["bash", "-c", adapt_bash(code, work)], capture_output=True, text=True,
                              env=env, timeout=900)
    else:
        proc = subprocess.run([sys.executable, "-c", code], cwd=work, capture_output=True, text=True,
                              env=env, timeout=900)
    assert proc.returncode == 0, f"{doc}:{line} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"


@pytest.mark.parametrize("block", [b for b in ALL if b[3] in ("norun", "engine")], ids=_id)
def test_norun_block_names_real_things(block):
    """A block that cannot run here still names existing scripts and real flags."""
    doc, line, lang, _flag, code = block
    if lang != "bash":
        compile(code, f"{doc}:{line}", "exec")
        return
    from reform_eval import run_eval
    flags = {a for act in run_eval.build_parser()._actions for a in act.option_strings}
    for cmd in code.replace("\\\n", " ").splitlines():
        cmd = cmd.split("#", 1)[0]
        for script in re.findall(r"\b(\S+\.(?:py|sh))\b", cmd):
            if not script.startswith(("/", "$")) and "/" in script or script in ("run_eval.py", "run_loader_eval.py"):
                assert os.path.exists(os.path.join(ROOT, script)), f"{doc}:{line}: {script} does not exist"
        if "run_eval.py" in cmd or "run_eval " in cmd:
            for flag in re.findall(r"(?<!\S)(--[a-z_]+)", cmd):
                assert flag in flags, f"{doc}:{line}: run_eval has no flag {flag}"


def test_every_doc_block_is_classified():
    """No bash/python block escapes the runner by an unknown fence flag."""
    assert ALL, "no documented blocks found"
    for doc, line, _lang, flag, _code in ALL:
        assert flag in ("", "norun", "engine"), (f"{doc}:{line}: unknown fence flag {flag!r} (use 'norun', "
                                                 "'engine' or nothing)")


def _flag_table(doc: str, heading: str) -> List[str]:
    """The flags in the first column of the table under ``heading`` in ``doc``."""
    text = open(os.path.join(ROOT, doc), encoding="utf-8").read()
    section = text.split(heading + "\n", 1)[1]
    flags = []
    for line in section.splitlines()[1:]:
        if line.startswith("#"):
            break
        if line.startswith("| `-"):
            flags += re.findall(r"(--[a-z_]+)", line.split("|")[1])
    return flags


@pytest.mark.parametrize("cli,heading", [("run_eval", "### run_eval flags"),
                                         ("run_loader_eval", "### run_loader_eval flags")])
def test_readme_flag_tables_list_every_flag(cli: str, heading: str) -> None:
    """README's flag tables are the parsers' flags, no more, no fewer (a new flag needs its row)."""
    import importlib
    parser = importlib.import_module(f"reform_eval.{cli}").build_parser()
    real = [a.option_strings[-1] for a in parser._actions if a.option_strings and a.dest != "help"]
    listed = _flag_table("README.md", heading)
    assert sorted(set(real) - set(listed)) == [], f"README {heading!r} lacks these flags"
    assert sorted(set(listed) - set(real)) == [], f"README {heading!r} lists flags {cli} does not have"
    assert len(listed) == len(set(listed)), "a flag is listed twice"


def test_placeholder_checkpoints_say_so_and_how_to_try_them():
    """A block with a placeholder path (/path/to/...) says it is one, and that tiny runs it."""
    found = [b for b in ALL if "/path/to/" in b[4] and "--model_name /path/to/" in b[4].replace("\\\n", " ")]
    assert found, "no placeholder block found (the test would check nothing)"
    for doc, line, _lang, _flag, code in found:
        comments = " ".join(ln for ln in code.splitlines() if ln.lstrip().startswith("#"))
        assert "placeholder" in comments and "--model_name tiny" in comments, (
            f"{doc}:{line}: say in a comment that the /path/to/ checkpoint is a placeholder and that "
            "--model_name tiny runs the line")
