"""Tiny-model cache: built completely by any rank, verified, published atomically; a
half-built or truncated cache is rebuilt, never trusted (issue 9 items 7 and 12)."""
from __future__ import annotations

import json
import os
import socket

import pytest
import torch

from reform_eval.models import get_model
from reform_eval.models.checkpoint_files import check_safetensors
from reform_eval.models.tiny import _DONE, _build_lock, cache_problem, tiny_model_path
from reform_eval.utils.errors import ReformError


@pytest.fixture
def empty_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("REFORM_CACHE", str(tmp_path / "cache"))
    from reform_eval import models
    models._load_all()  # importing the interfaces registers every tiny builder
    return tmp_path / "cache"


def _files(path):
    return sorted(os.listdir(path))


def test_build_on_distributed_rank_1_still_writes_weights(empty_cache, monkeypatch):
    """transformers saves weights only on distributed rank 0: a tiny model built by rank 1
    must still get its weights (today: marker, but no model.safetensors)."""
    with monkeypatch.context() as m:
        m.setattr(torch.distributed, "is_initialized", lambda: True)
        m.setattr(torch.distributed, "get_rank", lambda group=None: 1)
        path = tiny_model_path("llava")
    assert "model.safetensors" in _files(path) and "config.json" in _files(path)
    assert cache_problem(path) is None
    marker = json.load(open(os.path.join(path, _DONE)))
    assert marker["files"]["model.safetensors"] == os.path.getsize(os.path.join(path, "model.safetensors"))
    model, _ = get_model("llava", {"model_name": "tiny", "device": "cpu"})
    assert model.model_path == path


@pytest.mark.parametrize("damage", ["legacy_marker_no_weights", "truncated_weights", "missing_config"])
def test_half_built_cache_is_rebuilt(empty_cache, damage):
    good = tiny_model_path("llava")
    weights = os.path.join(good, "model.safetensors")
    size = os.path.getsize(weights)
    if damage == "legacy_marker_no_weights":  # what the torchrun race left behind
        for name in os.listdir(good):
            if name not in ("tokenizer.json", "processor_config.json"):
                os.unlink(os.path.join(good, name))
        with open(os.path.join(good, _DONE), "w") as f:
            f.write("llava tiny v1\n")
    elif damage == "truncated_weights":
        with open(weights, "r+b") as f:
            f.truncate(size // 2)
    else:
        os.unlink(os.path.join(good, "config.json"))
    assert cache_problem(good) is not None
    again = tiny_model_path("llava")
    assert again == good and cache_problem(again) is None
    assert os.path.getsize(weights) == size
    get_model("llava", {"model_name": "tiny", "device": "cpu"})


def test_truncated_user_checkpoint_is_one_line_naming_the_file(empty_cache, tmp_path):
    import shutil
    ckpt = tmp_path / "ckpt"
    shutil.copytree(tiny_model_path("llava"), ckpt)
    weights = ckpt / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) - 1000])
    with pytest.raises(ReformError) as e:
        get_model("llava", {"model_name": str(ckpt), "device": "cpu"})
    msg = str(e.value)
    assert "\n" not in msg and str(weights) in msg and "truncated" in msg
    weights.write_bytes(data[:5])
    with pytest.raises(ReformError, match="truncated safetensors file"):
        check_safetensors(str(weights))


def test_stale_build_lock_of_a_dead_process_is_taken_over(tmp_path):
    import subprocess
    import sys
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    lock = tmp_path / "x.lock"
    lock.write_text(json.dumps({"host": socket.gethostname(), "pid": dead.pid}))
    with _build_lock(str(lock), timeout_s=2):
        assert json.loads(lock.read_text())["pid"] == os.getpid()
    assert not lock.exists()
    lock.write_text(json.dumps({"host": socket.gethostname(), "pid": os.getpid()}))  # held by a live process
    with pytest.raises(ReformError, match="waited"):
        with _build_lock(str(lock), timeout_s=0.3):
            pass


@pytest.mark.slow
def test_first_torchrun_on_an_empty_cache(tmp_path):
    """The issue's scenario: ``torchrun --nproc_per_node=2 run_eval.py --model_name tiny`` on
    an empty cache succeeds, and leaves a complete, verified checkpoint for later runs."""
    import subprocess
    import sys

    from tests.conftest import write_custom_dataset
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cfg = write_custom_dataset(str(tmp_path / "data"), n=4)
    cache = tmp_path / "empty_cache"
    env = dict(os.environ, REFORM_CACHE=str(cache), OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           os.path.join(root, "run_eval.py"), "--model", "llava", "--model_name", "tiny", "--dataset_name",
           "custom", "--dataset_config", cfg, "--infer_method", "likelihood", "--output_dir", str(tmp_path / "out")]
    done = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Writing model shards" not in done.stderr  # building a model is no news on the console
    path = cache / "tiny" / "llava" / "tiny-v1"
    assert cache_problem(str(path)) is None
    assert sorted(os.listdir(path.parent)) == ["tiny-v1"]  # no lock, temp or stale directories left
