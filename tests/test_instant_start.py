"""Every start loads only what it uses (issue 24): ``--help``, a baseline run, an endpoint run and
offline scoring never import torch or transformers (``--help`` and an endpoint run no matplotlib, networkx or numpy either); the
in-process families load them when asked. ``bench/overhead.py`` measures the CPU seconds."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.conftest import write_custom_dataset
from tests.test_request_window import Server, ok_body

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEAVY = ("torch", "transformers", "matplotlib", "scipy", "accelerate", "networkx", "numpy")

PROBE = """
import json, runpy, sys
argv = json.loads(sys.argv[1])
sys.argv = argv
try:
    runpy.run_path(argv[0], run_name="__main__")
except SystemExit as e:
    code = e.code
print("LOADED " + json.dumps(sorted(m for m in %r if m in sys.modules)) + " CODE " + json.dumps(code))
""" % (HEAVY,)


def loaded(*argv: str) -> list:
    """The heavy packages a command line imported (run in a fresh interpreter), and it exited 0."""
    done = subprocess.run([sys.executable, "-c", PROBE, json.dumps([*argv])], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    line = [ln for ln in done.stdout.splitlines() if ln.startswith("LOADED ")][-1]
    mods, code = line[len("LOADED "):].split(" CODE ")
    assert json.loads(code) in (0, None), done.stderr[-2000:]
    return json.loads(mods)


def test_help_loads_no_heavy_package():
    assert loaded(os.path.join(ROOT, "run_eval.py"), "--help") == []
    assert loaded(os.path.join(ROOT, "run_loader_eval.py"), "--help") == []


def test_a_baseline_run_and_its_scoring_load_neither_torch_nor_transformers(tmp_path):
    cfg = write_custom_dataset(str(tmp_path / "data"), n=6)
    out = tmp_path / "out"
    mods = loaded(os.path.join(ROOT, "run_eval.py"), "--model", "random", "--dataset_name", "custom",
                  "--dataset_config", cfg, "--output_dir", str(out), "--do_eval")
    assert "torch" not in mods and "transformers" not in mods and "accelerate" not in mods
    pred = [f for f in os.listdir(out) if f.endswith(".json") and f.count(".") == 1][0]
    mods = loaded(os.path.join(ROOT, "run_loader_eval.py"), "--prediction_file", str(out / pred),
                  "--output_dir", str(tmp_path / "scored"))
    assert "torch" not in mods and "transformers" not in mods


def test_an_endpoint_run_loads_neither_torch_nor_transformers(tmp_path):
    server = Server(lambda body, n: (0.0, 200, {}, ok_body("red")))
    try:
        cfg = write_custom_dataset(str(tmp_path / "data"), n=4, formulation="Generation")
        mods = loaded(os.path.join(ROOT, "run_eval.py"), "--model", "openai_api", "--model_name", "m",
                      "--model_option", f"base_url={server.url}", "--dataset_name", "custom", "--formulation",
                      "Generation", "--dataset_config", cfg, "--output_dir", str(tmp_path / "out"))
    finally:
        server.close()
    assert mods == []
    assert len(server.bodies) == 4
