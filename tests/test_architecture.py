"""The layers of docs/architecture.md, checked on the real import graph.

Every module is parsed; an import that goes up a layer, an import cycle between modules, or a
project import inside a function fails with the edge that breaks the rule.
"""
from __future__ import annotations

import ast
import functools
import os
from collections import defaultdict
from typing import Dict, List, Optional, Set, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("utils", "build", "models", "metrics", "evaluation", "configs")
LAYER = {"utils": 1, "configs": 1, "build": 2, "models": 2, "metrics": 2, "evaluation": 3,
         "run_eval": 4, "run_loader_eval": 4}


def modules() -> Dict[str, str]:
    out = {}
    for top in PACKAGES:
        for dp, dns, fns in os.walk(os.path.join(ROOT, top)):
            dns[:] = [d for d in dns if not d.startswith((".", "__"))]
            for f in fns:
                if f.endswith(".py"):
                    rel = os.path.relpath(os.path.join(dp, f), ROOT)[:-3].replace(os.sep, ".")
                    out[rel[:-len(".__init__")] if rel.endswith(".__init__") else rel] = os.path.join(dp, f)
    for cli in ("run_eval", "run_loader_eval"):
        out[cli] = os.path.join(ROOT, "reform_eval", cli + ".py")
    return out


#: the one import package: module names here are without it (``utils.errors``)
PACKAGE = "reform_eval."


def _resolve(name: str, mods: Dict[str, str]) -> str:
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name


def graph(probes: Optional[Dict[str, str]] = None) -> Tuple[Dict[str, Set[str]], List[Tuple[str, str, int]]]:
    """(module -> imported project modules, [(module, import, line) of function-level imports]);
    ``probes``: modules (name -> source text) that test the graph itself: only they are read
    then (the project's modules are still the names imports resolve to)."""
    mods = modules()
    if not probes:
        return _project_graph()
    mods.update({name: f"<probe {name}>.py" for name in probes})
    edges: Dict[str, Set[str]] = defaultdict(set)
    inner: List[Tuple[str, str, int]] = []
    for mod, source in probes.items():
        _edges_of(mod, mods[mod], source, mods, edges, inner)
    return edges, inner


@functools.lru_cache(maxsize=1)
def _project_graph() -> Tuple[Dict[str, Set[str]], List[Tuple[str, str, int]]]:
    """The project's graph, read once per test process (every check below reads the same files)."""
    mods = modules()
    edges: Dict[str, Set[str]] = defaultdict(set)
    inner: List[Tuple[str, str, int]] = []
    for mod, path in mods.items():
        with open(path, encoding="utf-8") as f:
            _edges_of(mod, path, f.read(), mods, edges, inner)
    return edges, inner


def _edges_of(mod: str, path: str, source: str, mods: Dict[str, str], edges: Dict[str, Set[str]],
              inner: List[Tuple[str, str, int]]) -> None:
    """The project imports of one module (``source``) added to ``edges`` and ``inner``."""
    tree = ast.parse(source)
    pkg = mod if path.endswith("__init__.py") else mod.rpartition(".")[0]
    funcs = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    nested = {id(sub) for f in funcs for sub in ast.walk(f)}
    for node in ast.walk(tree):
        names = []  # project modules without the package's name (``utils.errors``)
        if isinstance(node, ast.Import):
            names = [a.name[len(PACKAGE):] for a in node.names if a.name.startswith(PACKAGE)]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's own package (its name is without PACKAGE)
                parts = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                base = ".".join([p for p in parts if p] + ([base] if base else []))
            elif base.startswith(PACKAGE):
                base = base[len(PACKAGE):]
            elif base == PACKAGE[:-1]:  # ``from reform_eval import evaluation``
                base = ""
            else:
                continue  # a third-party import
            names = [f"{base}.{a.name}" if base else a.name for a in node.names] + [base]
        for n in names:
            target = _resolve(n, mods)
            if target and target != mod and not mod.startswith(target + "."):
                edges[mod].add(target)
                if id(node) in nested:
                    inner.append((mod, target, node.lineno))


def test_the_graph_sees_the_imports_in_both_spellings():
    """The checks below are only as good as the graph: relative imports inside the package and
    absolute ones (``from reform_eval.utils...``) are both edges; a missed spelling would pass
    every layer rule with no edge to check."""
    edges, _ = graph()
    assert "utils.errors" in edges["build.registry"] and "configs" in edges["build.registry"]
    assert "evaluation.boundary" in edges["run_eval"]
    assert sum(len(t) for t in edges.values()) > 300


def test_the_graph_sees_an_upward_import_in_every_spelling():
    """Each way of writing an import of ``evaluation`` from ``utils`` is an edge, so
    ``test_no_upward_imports`` refuses it (``from reform_eval import evaluation`` was no edge: only
    the spelling rule below caught it)."""
    for line in ("from ..evaluation import engine", "from .. import evaluation", "from ..evaluation.engine import x",
                 "from reform_eval.evaluation import engine", "from reform_eval import evaluation",
                 "import reform_eval.evaluation.engine", "def f():\n    from reform_eval import evaluation"):
        edges, _ = graph({"utils._probe": line})
        assert {t.split(".")[0] for t in edges["utils._probe"]} == {"evaluation"}, line
    edges, _ = graph({"utils._probe": "from reform_eval import refuse_short_name\nimport os"})
    assert not edges["utils._probe"]


def test_package_modules_import_each_other_relatively():
    """Inside the package, project imports are relative (docs/architecture.md, "One package"), so
    an import graph tool that reads the folders sees the layers; the one absolute import left is
    the short-name refusal, which runs only when there is no package to be relative to."""
    mods = modules()
    bad = []
    for mod, path in mods.items():
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "reform_eval":
                if [a.name for a in node.names] != ["refuse_short_name"]:
                    bad.append(f"{os.path.relpath(path, ROOT)}:{node.lineno} from {node.module}")
            elif isinstance(node, ast.Import):
                bad += [f"{os.path.relpath(path, ROOT)}:{node.lineno} import {a.name}" for a in node.names
                        if a.name.split(".")[0] == "reform_eval"]
    assert not bad, bad


def test_no_upward_imports():
    edges, _ = graph()
    bad = []
    for mod, targets in edges.items():
        for t in targets:
            a, b = mod.split(".")[0], t.split(".")[0]
            up = LAYER[b] > LAYER[a]
            sideways = LAYER[a] == LAYER[b] == 2 and a != b and not (a == "metrics" and b == "build")
            if up or sideways:
                bad.append(f"{mod} -> {t}")
    assert not bad, bad


def test_the_command_lines_do_not_import_each_other():
    edges, _ = graph()
    assert "run_loader_eval" not in edges["run_eval"] and "run_eval" not in edges["run_loader_eval"]


def test_no_import_cycles():
    edges, _ = graph()
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on: Set[str] = set()
    cycles: List[List[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))
    for v in list(edges):
        if v not in index:
            visit(v)
    assert not cycles, cycles


def test_project_imports_at_module_top():
    _, inner = graph()
    assert not inner, [f"{m}:{line} imports {t} inside a function" for m, t, line in inner]


def test_command_lines_are_thin():
    for cli in ("run_eval.py", "run_loader_eval.py"):
        with open(os.path.join(ROOT, "reform_eval", cli), encoding="utf-8") as f:
            assert sum(1 for _ in f) < 200, cli
        with open(os.path.join(ROOT, cli), encoding="utf-8") as f:  # the clone's launcher: a start, no logic
            assert sum(1 for _ in f) < 15, cli


def _python_files():
    for top in PACKAGES + ("reform_eval", "tests", "bench"):
        for dp, dns, fns in os.walk(os.path.join(ROOT, top)):
            dns[:] = [d for d in dns if not d.startswith((".", "__"))]
            yield from (os.path.join(dp, f) for f in fns if f.endswith(".py"))
    yield from (os.path.join(ROOT, f) for f in ("run_eval.py", "run_loader_eval.py", "setup.py"))


def test_nothing_imports_a_subpackage_under_its_short_name():
    """``utils`` and ``reform_eval.utils`` would be two modules with two registries: every
    project import goes through the one package (docs/architecture.md, "One package")."""
    short = set(PACKAGES) | {"run_eval", "run_loader_eval"}
    bad = []
    for path in _python_files():
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            bad += [f"{os.path.relpath(path, ROOT)}:{node.lineno} imports {n}" for n in names
                    if n.split(".")[0] in short]
    assert not bad, bad


def test_no_script_or_doc_imports_a_subpackage_under_its_short_name():
    """The same rule for the Python inside shell scripts and docs: run from the clone's root such
    code would work, with a second copy of every module it imports."""
    import glob
    import re
    short = "|".join(PACKAGES)
    pattern = re.compile(rf"(?:^|[;\s\"'])(?:from ({short})(?:\.[\w.]+)? import |import ({short})\b(?!\.\w+ import))",
                         re.M)
    files = glob.glob(os.path.join(ROOT, "commands", "*.sh")) + glob.glob(os.path.join(ROOT, "docs", "*.md")) + \
        [os.path.join(ROOT, "README.md")]
    bad = []
    for path in files:
        text = open(path, encoding="utf-8").read()
        bad += [f"{os.path.relpath(path, ROOT)}:{text[:m.start()].count(chr(10)) + 1}: {m.group(0).strip()}"
                for m in pattern.finditer(text)]
    assert not bad, bad


#: third-party packages too heavy for a start that does not need them (issue 24: --help, a
#: baseline, an endpoint run and offline scoring start without them)
HEAVY = ("torch", "transformers", "accelerate", "vllm", "matplotlib", "scipy", "mlflow", "wandb", "openpyxl",
         "pandas", "datasets", "safetensors", "tokenizers", "jinja2", "networkx", "numpy")


def _is_hf_stack(mod: str) -> bool:
    """Modules that run an in-process model and may import torch / transformers at their top:
    only a family that needs them imports them (models.__init__ loads families on demand)."""
    leaf = mod.rpartition(".")[2]
    if mod.startswith("models.hf_") or mod in ("models.sampling", "evaluation.training"):
        return True
    return mod.startswith("models.interfaces.") and leaf not in (
        "base_interface", "baseline_interface", "openai_api_interface", "__init__")


def heavy_imports() -> Tuple[List[Tuple[str, str]], List[Tuple[str, str]]]:
    """([(module, package) imported at module top], [(module, package) imported in a function])."""
    top, inner = set(), set()
    for mod, path in modules().items():
        tree = ast.parse(open(path, encoding="utf-8").read())
        funcs = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        nested = {id(sub) for f in funcs for sub in ast.walk(f)}
        # ``if TYPE_CHECKING:`` imports never run: they load nothing
        typing_only = {id(sub) for n in ast.walk(tree) if isinstance(n, ast.If)
                       and getattr(n.test, "id", getattr(n.test, "attr", None)) == "TYPE_CHECKING"
                       for stmt in n.body for sub in ast.walk(stmt)}
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            for n in names:
                root = n.split(".")[0]
                if root in HEAVY:
                    (inner if id(node) in nested else top).add((mod, root))
    return sorted(top), sorted(inner)


def test_heavy_packages_load_only_where_used():
    """At module top only in the in-process model stack; anywhere else inside the one function
    that needs it, and every such place listed in docs/architecture.md (module and package)."""
    top, inner = heavy_imports()
    bad = [f"{m} imports {p} at module top" for m, p in top if not _is_hf_stack(m)]
    assert not bad, bad
    with open(os.path.join(ROOT, "docs", "architecture.md"), encoding="utf-8") as f:
        doc = f.read()
    section = doc.split("## Heavy imports", 1)[1].split("\n## ", 1)[0]
    rows = {line.split("|")[1].strip(" `"): line for line in section.splitlines()
            if line.startswith("| `")}
    missing = [f"{m} ({p})" for m, p in inner if not _is_hf_stack(m)
               and not (m in rows and f"`{p}`" in rows[m])]
    assert not missing, f"function-level heavy imports not listed in docs/architecture.md: {missing}"
    stale = [m for m in rows if m not in {x for x, _ in inner}]
    assert not stale, f"docs/architecture.md lists heavy imports that are gone: {stale}"
