"""The one import package in a clone (docs/architecture.md, "One package"): the repository's
folders are reform_eval's subpackages and nothing else; under a short name they refuse; the
code revision is recorded only for the harness's own checkout."""
from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import ROOT
from reform_eval import SUBPACKAGES
from reform_eval.evaluation.runinfo import code_revision


def _py(code: str, cwd: str = ROOT) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=120, env=env)


def test_a_subpackage_under_its_short_name_refuses_in_one_line():
    for name in SUBPACKAGES:
        done = _py(f"import {name}")
        assert done.returncode == 1
        assert done.stderr.strip().splitlines()[-1] == (
            f"ImportError: '{name}' here is the harness's subpackage reform_eval.{name}: import it as "
            f"reform_eval.{name} (the repository's folders are subpackages of reform_eval; docs/architecture.md)")


def test_only_the_subpackages_join_the_package():
    """The clone's root is not the package's path: no reform_eval.setup (importing it would run
    setup()), no reform_eval.reform_eval.reform_eval... (each level a copy of the registries)."""
    done = _py("import pkgutil, reform_eval, importlib.util as u\n"
               "print(sorted(m.name for m in pkgutil.walk_packages(reform_eval.__path__, 'reform_eval.')))\n"
               "print([n for n in ('setup', 'tests', 'bench', 'reform_eval') if u.find_spec('reform_eval.' + n)])\n"
               "import reform_eval.utils.errors as e; print(e.__file__)")
    assert done.returncode == 0, done.stderr
    walked, extra, where = done.stdout.splitlines()
    assert walked == "['reform_eval.run_eval', 'reform_eval.run_loader_eval']"
    assert extra == "[]"
    assert where == os.path.join(ROOT, "utils", "errors.py")


def test_the_subpackages_come_from_the_tree_of_the_package_imported(tmp_path):
    """A second checkout using this venv (whose editable install points at another one) gets its
    own folders, never a mix of two trees."""
    other = tmp_path / "other"
    os.makedirs(other / "reform_eval")
    os.makedirs(other / "utils")
    with open(os.path.join(ROOT, "reform_eval", "__init__.py"), encoding="utf-8") as f:
        (other / "reform_eval" / "__init__.py").write_text(f.read())
    (other / "utils" / "__init__.py").write_text("MARK = 'other tree'\n")
    done = _py("import reform_eval.utils as u; print(u.MARK)", cwd=str(other))
    assert done.returncode == 0 and done.stdout.strip() == "other tree", done.stderr


def test_the_code_revision_is_the_harness_checkouts_only(tmp_path):
    """An installed copy inside some other repository (a user's project, a clone's .venv) records
    no commit: that repository's HEAD is not the harness's code."""
    repo = tmp_path / "project"
    inner = repo / "venv" / "site-packages" / "reform_eval"
    inner.mkdir(parents=True)
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run(git + ["init", "-q", str(repo)], check=True)
    (repo / "f").write_text("x")
    subprocess.run(git + ["-C", str(repo), "add", "f"], check=True)
    subprocess.run(git + ["-C", str(repo), "commit", "-qm", "m"], check=True)
    assert code_revision(str(inner)) == (None, None)
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert code_revision(str(repo)) == (head, False)
