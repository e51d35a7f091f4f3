"""Installing the harness into a user's environment takes no one else's names (issue 30).

A fresh venv holds PyPA's ``build`` and a research distribution with top-level ``utils`` and
``models`` packages (many research repositories have them). The project is built by
``python -m build`` (sdist and wheel, from the clone), installed (not editable) from each, run
from another directory, and uninstalled: the others' packages stay intact throughout.
"""
from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile

import pytest

from tests.conftest import ROOT, prediction_files

pytestmark = pytest.mark.slow

RESEARCH_SETUP = """from setuptools import setup
setup(name="research-repo", version="1.0", packages=["utils", "models"])
"""


def _run(cmd, cwd, **kw):
    env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1")
    env.pop("PYTHONPATH", None)
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=600, env=env, **kw)
    assert done.returncode == 0, (cmd, done.stdout[-2000:], done.stderr[-3000:])
    return done


def _others_intact(py: str, cwd: str) -> None:
    """PyPA build and the research packages import as themselves."""
    out = _run([py, "-c", "from build import ProjectBuilder; import build.__main__; import utils, models; "
                          "print(utils.MARK, models.MARK)"], cwd).stdout.split()
    assert out == ["research-utils", "research-models"]


def test_the_harness_coexists_with_pypa_build_and_a_research_repository(tmp_path):
    venv = str(tmp_path / "venv")
    _run([sys.executable, "-m", "venv", venv], str(tmp_path))
    py = os.path.join(venv, "bin", "python")
    _run([py, "-m", "pip", "install", "-q", "build"], str(tmp_path))
    research = tmp_path / "research"
    for pkg in ("utils", "models"):
        (research / pkg).mkdir(parents=True)
        (research / pkg / "__init__.py").write_text(f"MARK = 'research-{pkg}'\n")
    (research / "setup.py").write_text(RESEARCH_SETUP)
    _run([py, "-m", "pip", "install", "-q", str(research)], str(tmp_path))
    _others_intact(py, str(tmp_path))

    # PyPA's build as users type it, in a clone's root (whose build/ comes first on sys.path)
    clone = tmp_path / "clone"
    for rel in _run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], ROOT).stdout.split():
        os.makedirs(clone / os.path.dirname(rel), exist_ok=True)
        shutil.copy2(os.path.join(ROOT, rel), clone / rel)
    dist = str(tmp_path / "dist")
    _run([py, "-m", "build", "--sdist", "--wheel", "--outdir", dist], str(clone))
    (wheel,) = glob.glob(os.path.join(dist, "*.whl"))
    (sdist,) = glob.glob(os.path.join(dist, "*.tar.gz"))
    tops = {n.split("/")[0] for n in zipfile.ZipFile(wheel).namelist()}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"reform_eval"}, tops
    _others_intact(py, str(tmp_path))
    # (built above with PyPA's build and nothing of the harness's dependencies installed:
    # python -m build in the clone never runs the harness's builders)
    # the harness's dependencies come from the project's venv, after the fresh venv's own packages
    site = _run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], str(tmp_path)).stdout.strip()
    with open(os.path.join(site, "zz_project_deps.pth"), "w") as f:
        f.write(sysconfig.get_paths()["purelib"] + "\n")

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    run_eval = os.path.join(venv, "bin", "run_eval")
    for artefact in (sdist, wheel):
        _run([py, "-m", "pip", "install", "-q", "--no-deps", artefact], str(tmp_path))
        _others_intact(py, str(elsewhere))
        assert "--dataset_config" in _run([run_eval, "--help"], str(elsewhere)).stdout
        out = str(elsewhere / f"out-{len(os.listdir(elsewhere))}")
        _run([run_eval, "--model", "random", "--dataset_name", "iWISDM", "--dataset_config", "iwisdm_low",
              "--dataset_subsample", "4", "--output_dir", out], str(elsewhere))
        assert [os.path.basename(p)[:7] for p in prediction_files(out)] == ["iWISDM_"]
        api = _run([py, "-c", "import reform_eval, sys; from reform_eval import load_reform_dataset, evaluate, "
                              "RunConfig, score; print(reform_eval.__file__); "
                              "print(sorted(m for m in sys.modules if m.split('.')[0] in ('utils', 'models', 'build')))"],
                   str(elsewhere)).stdout.splitlines()
        assert api[0].startswith(site) and api[1] == "[]", api  # the installed copy, no short names
        _run([py, "-m", "pip", "uninstall", "-y", "-q", "reform-lmm-eval"], str(tmp_path))
        _others_intact(py, str(elsewhere))
        gone = subprocess.run([py, "-c", "import reform_eval"], cwd=str(elsewhere), capture_output=True, text=True)
        assert gone.returncode != 0 and "No module named 'reform_eval'" in gone.stderr
