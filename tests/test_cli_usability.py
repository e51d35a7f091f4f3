"""The first ten minutes: shipped configs by name from any directory, --help lists every
dataset, case-insensitive names, a quiet console, and the package ships its configs."""
from __future__ import annotations

import glob
import os
import subprocess
import sys
import zipfile

import run_eval
from tests.conftest import prediction_files

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_help_lists_every_dataset_and_shipped_config():
    from build.registry import BUILDERS
    text = run_eval.build_parser().format_help()
    flat = " ".join(text.split())
    for name in BUILDERS:
        assert name in flat, name
    assert "custom" in flat and "iwisdm_high" in flat and "whole groups" in flat


def test_config_by_name_from_any_directory_and_lowercase_names(tmp_path):
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "run_eval.py"), "--model", "random",
                           "--dataset_name", "iwisdm", "--formulation", "singlechoice",
                           "--dataset_config", "iwisdm_low", "--dataset_subsample", "4", "--output_dir", "out"],
                          cwd=tmp_path, capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""  # quiet console: nothing but errors (none here)
    (pred,) = prediction_files(tmp_path / "out")
    assert os.path.basename(pred).startswith("iWISDM_SingleChoice_")


def test_wheel_ships_dataset_configs_and_data(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                           ROOT, "-w", str(tmp_path)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (wheel,) = glob.glob(str(tmp_path / "*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = {f"configs/datasets/{n}" for n in os.listdir(os.path.join(ROOT, "configs", "datasets"))}
    assert shipped and shipped <= names
    data = os.path.join(ROOT, "configs", "data")
    if os.path.isdir(data):
        files = {os.path.relpath(os.path.join(r, n), ROOT) for r, _, fs in os.walk(data) for n in fs}
        assert files and files <= names, files - names
