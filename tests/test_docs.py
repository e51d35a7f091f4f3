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

A fenced block (any language) whose first line is ``# file: PATH`` is a file the reader saves:
it is not run, but written to PATH in the scratch directory before every later block of its doc
runs (and checked to parse).

**Shown outputs are generated, not written.** What a block prints may be shown right after it,
as the next fenced block, fenced ``text output``, or, where it is markdown to render (a table),
between the lines ``<!-- output -->`` and ``<!-- /output -->``. Such a block runs as written (no
substitutions: the output shown is the output of the line shown), and its stdout must be what is
shown: the scratch directory's path is removed (``output/x`` stays ``output/x``), trailing blanks
are ignored, and a line ``...`` (``<!-- ... -->`` in the rendered form) stands for lines left out;
a table is never cut (the lines left out cannot begin or end inside one). Everything is compared
exactly (counts, accuracies, run ids: a run id is a hash of the run identity, the same on every
machine) except times: a number followed by ``s``, ``ms``, ``seconds``, ``CPU-seconds`` or
``minutes``, or the value of a ``*_seconds=`` / ``*_s=`` field, matches within a factor of
``TIME_TOLERANCE`` either way. A block whose output drifts fails. ``REFORM_DOCS_REGEN=1`` rewrites
the shown output of every block that drifted from its fresh run instead of failing (writers never
edit an output by hand), e.g. ``REFORM_DOCS_REGEN=1 python -m pytest tests/test_docs.py -k provenance``.
"""
from __future__ import annotations

import difflib
import fcntl
import os
import re
import shlex
import subprocess
import sys
from typing import List, NamedTuple, Optional, Tuple

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = ["README.md"] + sorted(os.path.join("docs", n) for n in os.listdir(os.path.join(ROOT, "docs"))
                              if n.endswith(".md"))
FENCE = re.compile(r"^```([A-Za-z]+)?(?:[ \t]+([A-Za-z-]+))?[ \t]*$")


#: a shown time may be this factor above or below the fresh run's (a loaded machine is slower)
TIME_TOLERANCE = 3.0
OUTPUT_OPEN, OUTPUT_CLOSE, OUTPUT_GAP = "<!-- output -->", "<!-- /output -->", ("...", "<!-- ... -->")


class Shown(NamedTuple):
    """A block's shown output: its lines (wildcards included) and where they are in the doc."""
    kind: str            # "fenced" (```text output) or "rendered" (<!-- output --> markdown)
    line: int            # 1-based line of the first shown line
    text: str


class DocFile(NamedTuple):
    """A fenced block whose first line is ``# file: PATH``: a file the reader saves, not a command."""
    doc: str
    line: int
    path: str
    text: str


FILE_HEADER = re.compile(r"^# file: (\S+)\s*$")
FILES: List[DocFile] = []


class Block(NamedTuple):
    doc: str
    line: int
    lang: str
    flag: str
    code: str
    output: Optional[Shown] = None


def blocks() -> List[Block]:
    """Every fenced bash/python block, each with the output shown after it (if any)."""
    out: List[Block] = []
    for doc in DOCS:
        lines = open(os.path.join(ROOT, doc), encoding="utf-8").read().splitlines()
        i = 0
        while i < len(lines):
            m = FENCE.match(lines[i])
            if lines[i].strip() == OUTPUT_OPEN:
                j = i + 1
                while j < len(lines) and lines[j].strip() != OUTPUT_CLOSE:
                    j += 1
                _attach(out, doc, Shown("rendered", i + 2, "\n".join(lines[i + 1:j])))
                i = j + 1
            elif m and m.group(1):
                start, lang, flag = i + 1, m.group(1), m.group(2) or ""
                j = i + 1
                while j < len(lines) and not lines[j].startswith("```"):
                    j += 1
                header = FILE_HEADER.match(lines[i + 1]) if i + 1 < j else None
                if header:
                    FILES.append(DocFile(doc, start, header.group(1), "\n".join(lines[i + 1:j]) + "\n"))
                elif lang in ("bash", "python"):
                    out.append(Block(doc, start, lang, flag, "\n".join(lines[i + 1:j])))
                elif flag == "output":
                    _attach(out, doc, Shown("fenced", i + 2, "\n".join(lines[i + 1:j])))
                i = j + 1
            else:
                i += 1
    return out


#: outputs shown with no code block of their own above them (test_every_doc_block_is_classified fails on them)
ORPHANS: List[str] = []


def _attach(out: List[Block], doc: str, shown: Shown) -> None:
    """An output belongs to the code block just above it (the last one before it in its doc)."""
    if not out or out[-1].doc != doc or out[-1].output is not None:
        ORPHANS.append(f"{doc}:{shown.line}")
        return
    out[-1] = out[-1]._replace(output=shown)


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


def adapt_bash(code: str, work: str, as_written: bool = False) -> str:
    """Apply the substitutions above to a bash block (only the placeholder checkpoint's when the
    block shows its output: that output is the output of the line as written)."""
    code = code.replace("\\\n", " ")
    lines = []
    for line in code.splitlines():
        body = line.split("#", 1)[0] if not line.lstrip().startswith("#") else ""
        m = re.search(r"--model_name\s+(\S+)", body)
        if m and m.group(1) != "tiny" and os.sep in m.group(1) and not os.path.exists(m.group(1)):
            body = body.replace(m.group(0), "--model_name tiny")
        if not as_written and ("run_eval.py" in body or re.search(r"(^|\s)run_eval\s", body)
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
        if b.flag == "engine":
            return [pytest.mark.engine, pytest.mark.slow]
        return [pytest.mark.slow] if any(m in b.code for m in SLOW_MARKERS) else []
    return [pytest.param(b, id=_id(b), marks=marks(b)) for b in ALL if b.flag != "norun"]


def _engine_available() -> None:
    """Skip (one line) unless the vLLM venv is built or can be built (commands/vllm_env.sh)."""
    from tests.conftest import vllm_python
    vllm_python()


# -- shown outputs ------------------------------------------------------------------------------

_TIME = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)(?=(?: ?(?:ms|s|seconds|CPU-seconds|minutes)\b))"
                   r"|(?<=_seconds=)(\d+(?:\.\d+)?)|(?<=_s=)(\d+(?:\.\d+)?)")


def normalize_output(stdout: str, work: str) -> List[str]:
    """The lines a block printed, as a reader of the docs sees them: the scratch directory's
    path removed, trailing blanks and surrounding empty lines dropped."""
    for prefix in sorted({work, os.path.realpath(work)}, key=len, reverse=True):
        stdout = stdout.replace(prefix + os.sep, "").replace(prefix, ".")
    lines = [ln.rstrip() for ln in stdout.splitlines()]
    while lines and not lines[0]:
        lines.pop(0)
    while lines and not lines[-1]:
        lines.pop()
    return lines


def line_matches(shown: str, actual: str) -> bool:
    """Equal, except that times may differ by up to TIME_TOLERANCE either way."""
    shown, actual = shown.rstrip(), actual.rstrip()
    if shown == actual:
        return True
    if _TIME.sub("T", shown) != _TIME.sub("T", actual):
        return False
    for a, b in zip(_TIME.finditer(shown), _TIME.finditer(actual)):
        x, y = float(next(g for g in a.groups() if g)), float(next(g for g in b.groups() if g))
        if not (x == y or (x > 0 and y > 0 and 1 / TIME_TOLERANCE <= y / x <= TIME_TOLERANCE)):
            return False
    return True


def _segments(shown: str) -> Tuple[List[List[str]], bool, bool]:
    """The shown lines split at the wildcards: (segments, leading wildcard, trailing wildcard)."""
    lines = [ln.rstrip() for ln in shown.splitlines()]
    while lines and not lines[0]:
        lines.pop(0)
    while lines and not lines[-1]:
        lines.pop()
    segs: List[List[str]] = [[]]
    for ln in lines:
        if ln.strip() in OUTPUT_GAP:
            segs.append([])
        else:
            segs[-1].append(ln)
    lead, trail = not segs[0], len(segs) > 1 and not segs[-1]
    return [g for g in segs if g], lead, trail


def _is_row(line: str) -> bool:
    return line.lstrip().startswith("|")


def output_matches(shown: str, actual: List[str]) -> bool:
    """Does ``actual`` (normalized lines) read as ``shown`` (wildcards, time tolerance, whole tables)?"""
    segs, lead, trail = _segments(shown)
    if not segs:
        return not actual

    def fits(k: int, pos: int) -> bool:
        if k == len(segs):
            return trail or pos == len(actual)
        seg = segs[k]
        starts = range(pos, len(actual) - len(seg) + 1) if (k > 0 or lead) else [pos]
        for s in starts:
            e = s + len(seg)
            if (_is_row(seg[0]) and s > pos and _is_row(actual[s - 1])) or \
                    (_is_row(seg[-1]) and e < len(actual) and _is_row(actual[e]) and (k + 1 < len(segs) or trail)):
                continue  # a gap may not begin or end inside a table
            if all(line_matches(a, b) for a, b in zip(seg, actual[s:e])) and fits(k + 1, e):
                return True
        return False
    return fits(0, 0)


def regenerate(shown: str, actual: List[str]) -> str:
    """The shown output rewritten from a fresh run, keeping its wildcards: each shown stretch is
    replaced by the stretch of ``actual`` it best aligns with (whole tables)."""
    segs, lead, trail = _segments(shown)
    gap = "<!-- ... -->" if "<!-- ... -->" in shown else "..."
    if not segs or (len(segs) == 1 and not lead and not trail):
        return "\n".join(actual)
    parts: List[str] = [gap] if lead else []
    pos = 0
    for k, seg in enumerate(segs):
        last = k == len(segs) - 1
        if k == 0 and not lead:
            s = 0
        else:
            cands = range(pos, max(pos, len(actual) - len(seg)) + 1)
            s = max(cands, key=lambda c: sum(difflib.SequenceMatcher(None, a, b).ratio()
                                            for a, b in zip(seg, actual[c:c + len(seg)])))
        e = len(actual) if (last and not trail) else min(len(actual), s + len(seg))
        if _is_row(seg[0]):
            while s > pos and _is_row(actual[s - 1]):
                s -= 1
        if _is_row(seg[-1]):
            while e > s and not _is_row(actual[e - 1]):
                e -= 1
            while e < len(actual) and _is_row(actual[e]):
                e += 1
        parts += actual[s:e] + ([gap] if not last or trail else [])
        pos = e
    return "\n".join(parts)


def rewrite_shown(block: Block, new_text: str) -> None:
    """Replace the block's shown output in its doc (under a lock: blocks of one doc may be
    regenerated at once); the output is the first one after the block's code, found by its markers."""
    path = os.path.join(ROOT, block.doc)
    fenced = block.output.kind == "fenced"
    with open(path + ".regen.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        text = open(path, encoding="utf-8").read()
        at = text.index(block.code + "\n```") + len(block.code)
        opener = re.compile(r"^```text[ \t]+output[ \t]*\n" if fenced else r"^" + re.escape(OUTPUT_OPEN) + r"[ \t]*\n",
                            re.M).search(text, at)
        closer = re.compile(r"^```[ \t]*$" if fenced else r"^" + re.escape(OUTPUT_CLOSE), re.M).search(text, opener.end())
        text = text[:opener.end()] + new_text.rstrip("\n") + "\n" + text[closer.start():]
        with open(path + ".regen.tmp", "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(path + ".regen.tmp", path)
    os.unlink(path + ".regen.lock")


def check_shown_output(block: Block, stdout: str, work: str) -> None:
    """Fail when the fresh run's stdout is not what the doc shows (or rewrite it when asked)."""
    actual = normalize_output(stdout, work)
    if output_matches(block.output.text, actual):
        return
    if os.environ.get("REFORM_DOCS_REGEN") == "1":
        rewrite_shown(block, regenerate(block.output.text, actual))
        return
    diff = "\n".join(difflib.unified_diff(block.output.text.splitlines(), actual, "shown", "fresh run", lineterm=""))
    raise AssertionError(f"{block.doc}:{block.output.line}: the output shown is not what the block above prints "
                         f"now (REFORM_DOCS_REGEN=1 rewrites it from a fresh run):\n{diff[-6000:]}")


@pytest.mark.spread
@pytest.mark.parametrize("block", _runnable())
def test_documented_block_runs(block, tmp_path):
    doc, line, lang, flag, code, shown = block
    if flag == "engine":
        _engine_available()
    work = scratch_tree(tmp_path)
    for f in FILES:  # the files the doc asks the reader to save before this block
        if f.doc == doc and f.line < line:
            os.makedirs(os.path.dirname(os.path.join(work, f.path)) or work, exist_ok=True)
            with open(os.path.join(work, f.path), "w", encoding="utf-8") as fh:
                fh.write(f.text)
    env = dict(os.environ, PYTHONPATH=work, OMP_NUM_THREADS="1", MPLBACKEND="Agg")
    if lang == "bash":
        proc = subprocess.run(["bash", "-c", adapt_bash(code, work, as_written=shown is not None)],
                              capture_output=True, text=True, env=env, timeout=900)
    else:
        proc = subprocess.run([sys.executable, "-c", code], cwd=work, capture_output=True, text=True,
                              env=env, timeout=900)
    assert proc.returncode == 0, f"{doc}:{line} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    if shown is not None:
        check_shown_output(block, proc.stdout, work)


@pytest.mark.parametrize("block", [b for b in ALL if b.flag in ("norun", "engine")], ids=_id)
def test_norun_block_names_real_things(block):
    """A block that cannot run here still names existing scripts and real flags."""
    doc, line, lang, _flag, code, _shown = block
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
        if "run_eval.py" in cmd or "run_eval " in cmd:  # the flags after it (torchrun's own come before)
            for flag in re.findall(r"(?<!\S)(--[a-z_]+)", re.split(r"run_eval(?:\.py)?\s", cmd, maxsplit=1)[-1]):
                assert flag in flags, f"{doc}:{line}: run_eval has no flag {flag}"


def test_every_doc_block_is_classified():
    """No bash/python block escapes the runner by an unknown fence flag."""
    assert ALL, "no documented blocks found"
    assert not ORPHANS, f"outputs shown after no code block of their own (or after one that has one): {ORPHANS}"
    for doc, line, _lang, flag, _code, shown in ALL:
        assert flag in ("", "norun", "engine"), (f"{doc}:{line}: unknown fence flag {flag!r} (use 'norun', "
                                                 "'engine' or nothing)")
        assert shown is None or flag == "", (f"{doc}:{shown.line}: an output is shown after a block the test "
                                             f"cannot run here ({flag}); show outputs only of blocks that run")


@pytest.mark.parametrize("f", FILES, ids=lambda f: f"{f.doc}:{f.line}")
def test_doc_files_are_valid(f):
    """A file a doc asks the reader to save parses (the blocks after it run with it)."""
    if f.path.endswith(".py"):
        compile(f.text, f"{f.doc}:{f.line}", "exec")
    elif f.path.endswith((".yaml", ".yml")):
        import yaml
        assert isinstance(yaml.safe_load(f.text), dict), f"{f.doc}:{f.line}: not a YAML mapping"


def test_the_docs_show_generated_outputs():
    """The convention is in use (the check below would otherwise check nothing)."""
    shown = [b for b in ALL if b.output is not None]
    assert {b.doc for b in shown} >= {"README.md", "docs/provenance.md"}, [_id(b) for b in shown]


OUT = ["explain B against A", "", "| model | acc |", "|---|---|", "| a | 0.5 |", "| b | 0.7 |", "",
       "scored in 12.5 s (report_seconds=3.1)", "accuracy moved by -0.0250: 1 samples flipped"]


@pytest.mark.parametrize("shown,ok", [
    ("\n".join(OUT), True),
    ("\n".join(OUT).replace("0.7 |", "0.8 |"), False),                  # a drifted number
    ("\n".join(OUT).replace("12.5 s", "30 s"), True),                   # a time within the tolerance
    ("\n".join(OUT).replace("12.5 s", "40 s"), False),                  # outside it
    ("\n".join(OUT).replace("report_seconds=3.1", "report_seconds=0.9"), False),
    ("\n".join(OUT).replace("-0.0250", "-0.0251"), False),              # a count or metric is never a time
    ("\n".join(["..."] + OUT[2:6] + ["..."]), True),                     # a whole table, the rest left out
    ("\n".join(["<!-- ... -->"] + OUT[2:6] + ["<!-- ... -->"]), True),
    ("\n".join(["..."] + OUT[2:5] + ["..."]), False),                    # a gap may not cut a table
    ("\n".join(OUT[:3] + ["..."]), False),
    ("\n".join(OUT[:-1]), False),                                       # a line missing at the end
    ("\n".join(OUT[:2] + ["..."] + OUT[-1:]), True),
])
def test_shown_output_check(shown, ok):
    assert output_matches(shown, OUT) is ok


def test_normalize_output_removes_the_scratch_directory():
    work = "/tmp/x/work"
    assert normalize_output("\nresults: /tmp/x/work/output/a.json  \nin /tmp/x/work\n\n", work) == [
        "results: output/a.json", "in ."]


def test_regenerate_keeps_the_gaps_and_takes_whole_tables():
    fresh = OUT[:5] + ["| c | 0.9 |"] + OUT[5:]
    shown = "\n".join(["..."] + OUT[2:6] + ["..."])
    assert regenerate(shown, fresh) == "\n".join(["..."] + fresh[2:7] + ["..."])
    assert output_matches(regenerate(shown, fresh), fresh)
    assert regenerate("\n".join(OUT), fresh) == "\n".join(fresh)
    last = "\n".join(["..."] + OUT[-1:])
    assert regenerate(last, fresh[:-1] + ["accuracy moved by +0.0000: 0 samples flipped"]) == \
        "...\naccuracy moved by +0.0000: 0 samples flipped"


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


FLAG_TABLES = "docs/usage.md"


@pytest.mark.parametrize("cli,heading", [("run_eval", "## run_eval flags"),
                                         ("run_loader_eval", "## run_loader_eval flags")])
def test_readme_flag_tables_list_every_flag(cli: str, heading: str) -> None:
    """The flag tables (docs/usage.md) are the parsers' flags, no more, no fewer (a new flag needs its row)."""
    import importlib
    parser = importlib.import_module(f"reform_eval.{cli}").build_parser()
    real = [a.option_strings[-1] for a in parser._actions if a.option_strings and a.dest != "help"]
    listed = _flag_table(FLAG_TABLES, heading)
    assert sorted(set(real) - set(listed)) == [], f"{FLAG_TABLES} {heading!r} lacks these flags"
    assert sorted(set(listed) - set(real)) == [], f"{FLAG_TABLES} {heading!r} lists flags {cli} does not have"
    assert len(listed) == len(set(listed)), "a flag is listed twice"


def test_placeholder_checkpoints_say_so_and_how_to_try_them():
    """A block with a placeholder path (/path/to/...) says it is one, and that tiny runs it."""
    found = [b for b in ALL if "/path/to/" in b.code and "--model_name /path/to/" in b.code.replace("\\\n", " ")]
    assert found, "no placeholder block found (the test would check nothing)"
    for doc, line, _lang, _flag, code, _shown in found:
        comments = " ".join(ln for ln in code.splitlines() if ln.lstrip().startswith("#"))
        assert "placeholder" in comments and "--model_name tiny" in comments, (
            f"{doc}:{line}: say in a comment that the /path/to/ checkpoint is a placeholder and that "
            "--model_name tiny runs the line")


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _prose(path: str) -> str:
    return re.sub(r"```.*?```", "", open(path, encoding="utf-8").read(), flags=re.S)


@pytest.mark.parametrize("doc", DOCS)
def test_relative_links_resolve(doc: str) -> None:
    """Every relative link of a doc names a file that exists and, with #anchor, a heading in it
    (moving a section between pages must move its links too)."""
    for link in re.findall(r"\]\(([^)\s]+)\)", _prose(os.path.join(ROOT, doc))):
        if link.startswith(("http://", "https://", "mailto:")):
            continue
        path, _, anchor = link.partition("#")
        target = os.path.normpath(os.path.join(ROOT, os.path.dirname(doc), path)) if path else os.path.join(ROOT, doc)
        assert os.path.exists(target), f"{doc}: link {link} names no file"
        if anchor and target.endswith(".md"):
            heads = {_slug(h) for h in re.findall(r"^#+ (.*)$", _prose(target), re.M)}
            assert anchor in heads, f"{doc}: link {link} names no heading of {os.path.relpath(target, ROOT)}"
