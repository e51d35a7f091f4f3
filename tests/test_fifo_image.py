"""A FIFO or device named as an image is refused in one line and never read. The content hash of
the run's identity (``utils.file_hashes``) reads regular files only; before, a FIFO blocked the
run at 'building the samples' and /dev/zero was read without end."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import write_custom_dataset

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_fifo_or_device_image_is_one_line_not_a_hang(tmp_path, kind):
    cfg = write_custom_dataset(str(tmp_path / "data"), n=2, formulation="Generation")
    items = tmp_path / "data" / "items.jsonl"
    recs = [json.loads(x) for x in items.read_text().splitlines()]
    if kind == "fifo":
        os.unlink(tmp_path / "data" / "img1.png")
        os.mkfifo(tmp_path / "data" / "img1.png")
    else:
        recs[1]["images"] = ["/dev/zero"]
        items.write_text("".join(json.dumps(r) + "\n" for r in recs))
    try:
        out = subprocess.run([sys.executable, "run_eval.py", "--model", "constant", "--dataset_name", "custom",
                              "--formulation", "Generation", "--dataset_config", cfg, "--output_dir",
                              str(tmp_path / "out"), "--no_cache"], cwd=ROOT, capture_output=True, text=True,
                             timeout=300)  # (a run that waits on the image never ends; a loaded machine's start is slow)
    except subprocess.TimeoutExpired:
        pytest.fail(f"run_eval still running after 300 s with a {kind} as an image")
    errors = [ln for ln in out.stderr.splitlines() if ln.startswith("error")]
    assert out.returncode == 2 and len(errors) == 1 and "regular file" in errors[0], out.stderr[-500:]
