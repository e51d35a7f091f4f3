"""The response cache: skips work, never serves a stale answer, survives kill -9 and concurrent
writers, and reports its hits and misses."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
from PIL import Image

import run_eval
from evaluation.cache import ResponseCache
from tests.conftest import ROOT, prediction_files, results_of, write_custom_dataset
from tests.test_openai_api import _Server


@pytest.fixture
def cache_on(monkeypatch):
    monkeypatch.delenv("REFORM_NO_CACHE", raising=False)


@pytest.fixture
def server():
    srv = _Server()
    yield srv
    srv.close()


def _api_run(srv, cfg, out, cache, *extra):
    argv = ["--model", "openai_api", "--model_name", "gpt-test", "--model_option", f"base_url={srv.url}",
            "--dataset_name", "custom", "--dataset_config", cfg, "--formulation", "Generation",
            "--output_dir", str(out), "--cache_dir", str(cache), "--do_eval", *extra]
    before = len(srv.requests)
    assert run_eval.main(argv) == 0
    return len(srv.requests) - before


def test_cache_skips_work_and_never_serves_stale(tmp_path, server, cache_on):
    data = tmp_path / "data"
    cfg = write_custom_dataset(str(data), n=6, formulation="Generation")
    cache = tmp_path / "cache"
    assert _api_run(server, cfg, tmp_path / "o1", cache) == 6                 # cold
    res = results_of(prediction_files(tmp_path / "o1")[0])
    assert res["response_cache"]["hits"] == 0 and res["response_cache"]["misses"] == 6
    assert _api_run(server, cfg, tmp_path / "o2", cache) == 0                 # same calls, new output dir
    res = results_of(prediction_files(tmp_path / "o2")[0])
    assert res["response_cache"] == {"hits": 6, "misses": 0, "directory": str(cache)}
    # the predictions served from the cache equal the ones the model made
    a, b = (json.load(open(prediction_files(tmp_path / o)[0])) for o in ("o1", "o2"))
    assert [r["prediction"] for r in a] == [r["prediction"] for r in b]
    # editing one item re-runs one request
    items = (data / "items.jsonl").read_text().splitlines()
    first = json.loads(items[0])
    first["question"] = "Which colour fills this picture?"
    (data / "items.jsonl").write_text("\n".join([json.dumps(first)] + items[1:]) + "\n")
    assert _api_run(server, cfg, tmp_path / "o3", cache) == 1
    # duplication 1 -> 3 re-runs only the new copies
    assert _api_run(server, cfg, tmp_path / "o4", cache, "--dataset_duplication", "3") == 12
    # a changed image (same path, other pixels) is a miss for that sample only
    Image.new("RGB", (32, 32), (1, 2, 3)).save(str(data / "img2.png"))
    assert _api_run(server, cfg, tmp_path / "o5", cache) == 1
    # a changed setting, model or prompt is a miss for every sample
    assert _api_run(server, cfg, tmp_path / "o6", cache, "--max_new_tokens", "7") == 6
    assert _api_run(server, cfg, tmp_path / "o7", cache, "--in_context_sample") == 6   # another prompt
    # --no_cache bypasses it
    assert _api_run(server, cfg, tmp_path / "o9", cache, "--no_cache") == 6


def test_another_served_model_or_seed_is_a_miss(tmp_path, server, cache_on):
    cfg = write_custom_dataset(str(tmp_path / "data"), n=4, formulation="Generation")
    cache = tmp_path / "cache"
    base = ["--model", "openai_api", "--model_option", f"base_url={server.url}", "--dataset_name", "custom",
            "--dataset_config", cfg, "--formulation", "Generation", "--cache_dir", str(cache)]
    n0 = len(server.requests)
    assert run_eval.main([*base, "--model_name", "gpt-a", "--output_dir", str(tmp_path / "a")]) == 0
    assert run_eval.main([*base, "--model_name", "gpt-b", "--output_dir", str(tmp_path / "b")]) == 0
    assert len(server.requests) - n0 == 8
    n1 = len(server.requests)
    assert run_eval.main([*base, "--model_name", "gpt-a", "--output_dir", str(tmp_path / "c"),
                          "--temperature", "1", "--seed", "1"]) == 0
    assert run_eval.main([*base, "--model_name", "gpt-a", "--output_dir", str(tmp_path / "d"),
                          "--temperature", "1", "--seed", "2"]) == 0
    assert len(server.requests) - n1 == 8


def test_a_changed_local_checkpoint_is_a_miss(tmp_path, cache_on):
    """Likelihood on a local checkpoint directory: new weight files are a new model."""
    from models.tiny import tiny_model_path
    ckpt = tmp_path / "ckpt"
    shutil.copytree(tiny_model_path("llava"), ckpt)
    cfg = write_custom_dataset(str(tmp_path / "data"), n=4)
    cache = tmp_path / "cache"
    argv = ["--model", "llava", "--model_name", str(ckpt), "--dataset_name", "custom", "--dataset_config", cfg,
            "--infer_method", "likelihood", "--cache_dir", str(cache), "--do_eval"]
    assert run_eval.main([*argv, "--output_dir", str(tmp_path / "a")]) == 0
    assert run_eval.main([*argv, "--output_dir", str(tmp_path / "b")]) == 0
    assert results_of(prediction_files(tmp_path / "b")[0])["response_cache"]["hits"] == 4
    a, b = (json.load(open(prediction_files(tmp_path / o)[0])) for o in "ab")
    assert [r["candidate_logprobs"] for r in a] == [r["candidate_logprobs"] for r in b]
    weights = next(p for p in os.listdir(ckpt) if p.endswith(".safetensors"))
    os.utime(ckpt / weights, ns=(1, 1))  # "new weights" (same bytes, new file stat)
    assert run_eval.main([*argv, "--output_dir", str(tmp_path / "c")]) == 0
    assert results_of(prediction_files(tmp_path / "c")[0])["response_cache"] == {
        "hits": 0, "misses": 4, "directory": str(cache)}


WRITER = """
import sys
sys.path.insert(0, {root!r})
from evaluation.cache import ResponseCache
c = ResponseCache({cache!r}, "m" * 64)
i = 0
while True:
    c.put_many([(f"key-{{i}}-{{j}}", {{"text": "x" * 5000, "n": i}}) for j in range(10)])
    i += 1
"""


def test_kill_9_while_writing_never_corrupts_the_store(tmp_path):
    cache = str(tmp_path / "cache")
    procs = [subprocess.Popen([sys.executable, "-c", WRITER.format(root=ROOT, cache=cache)]) for _ in range(2)]
    time.sleep(1.5)
    for p in procs:  # two writers at once, both killed mid-write
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
    segs = os.listdir(os.path.join(cache, "m" * 24))
    assert len(segs) == 2
    # damage one segment further: a torn half line and garbage bytes
    with open(os.path.join(cache, "m" * 24, segs[0]), "ab") as f:
        f.write(b'{"k": "torn", "c": 1, "v": {"te')
    with open(os.path.join(cache, "m" * 24, segs[1]), "ab") as f:
        f.write(b"\xff\xfe garbage\n" + json.dumps({"k": "bad-crc", "c": 0, "v": {"text": "y"}}).encode() + b"\n")
    c = ResponseCache(cache, "m" * 64)
    assert len(c.entries) >= 20 and "torn" not in c.entries and "bad-crc" not in c.entries
    assert all(v["text"] == "x" * 5000 for v in c.entries.values())
    assert c.skipped_lines >= 3
    # and it keeps working: a new writer appends to its own segment
    c.put_many([("new", {"text": "z"})])
    c.close()
    assert ResponseCache(cache, "m" * 64).get("new") == {"text": "z"}
