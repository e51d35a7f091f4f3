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

from reform_eval import run_eval
from reform_eval.evaluation.cache import ResponseCache
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
    from reform_eval.models.tiny import tiny_model_path
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
from reform_eval.evaluation.cache import ResponseCache
c = ResponseCache({cache!r}, "m" * 64)
i = 0
while True:
    c.put_many([(f"key-{{i}}-{{j}}", {{"text": "x" * 5000, "n": i}}) for j in range(10)])
    i += 1
"""


@pytest.mark.slow  # (quick subset: test_cache_skips_work_and_never_serves_stale covers the path)
def test_kill_9_while_writing_never_corrupts_the_store(tmp_path):
    cache = str(tmp_path / "cache")
    procs = [subprocess.Popen([sys.executable, "-c", WRITER.format(root=ROOT, cache=cache)]) for _ in range(2)]
    seg_dir = os.path.join(cache, "m" * 24)
    deadline = time.time() + 120  # both writers started and wrote (a loaded machine starts Python slowly)
    while time.time() < deadline and not (os.path.isdir(seg_dir) and len(os.listdir(seg_dir)) == 2
                                          and all(os.path.getsize(os.path.join(seg_dir, n)) > 200_000
                                                  for n in os.listdir(seg_dir))):
        time.sleep(0.05)
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


def test_baselines_answers_come_from_the_sample_so_the_sample_is_in_the_key(tmp_path, cache_on):
    """A prompt-only key would serve the reference baseline's old answer after the answer changed,
    and one random pick to every sample with the same prompt and image."""
    data = tmp_path / "data"
    data.mkdir()
    Image.new("RGB", (8, 8), (200, 0, 0)).save(str(data / "a.png"))
    items = [{"sample_id": f"q{i}", "images": ["a.png"], "question": "What colour is it?", "answer": "red"}
             for i in range(3)]
    (data / "items.jsonl").write_text("\n".join(json.dumps(r) for r in items) + "\n")
    (data / "c.yaml").write_text("data_file: items.jsonl\n")
    argv = ["--model", "reference", "--dataset_name", "custom", "--dataset_config", str(data / "c.yaml"),
            "--formulation", "Generation", "--cache_dir", str(tmp_path / "cache"), "--do_eval"]
    assert run_eval.main([*argv, "--output_dir", str(tmp_path / "o1")]) == 0
    items[0]["answer"] = "green"
    (data / "items.jsonl").write_text("\n".join(json.dumps(r) for r in items) + "\n")
    assert run_eval.main([*argv, "--output_dir", str(tmp_path / "o2")]) == 0
    res = results_of(prediction_files(tmp_path / "o2")[0])
    assert res["metrics"]["accuracy"] == 1.0 and res["response_cache"]["misses"] == 1
    # random picks: another seed is another pick, and same-prompt samples keep their own picks
    cfg = write_custom_dataset(str(tmp_path / "r"), n=12)
    base = ["--model", "random", "--infer_method", "likelihood", "--dataset_name", "custom", "--dataset_config", cfg,
            "--shuffle_options", "false", "--random_instruct", "false", "--cache_dir", str(tmp_path / "cache")]
    preds = {}
    for seed in ("0", "1"):
        for cache in ("on", "off"):
            out = tmp_path / f"r{seed}{cache}"
            assert run_eval.main([*base, "--seed", seed, "--output_dir", str(out),
                                  *(["--no_cache"] if cache == "off" else [])]) == 0
            preds[seed, cache] = [r["prediction"] for r in json.load(open(prediction_files(out)[0]))]
    assert preds["0", "on"] == preds["0", "off"] and preds["1", "on"] == preds["1", "off"]
    assert preds["0", "off"] != preds["1", "off"]


def test_a_hand_edited_segment_line_is_a_miss_not_a_crash(tmp_path, server, cache_on):
    cfg = write_custom_dataset(str(tmp_path / "data"), n=2, formulation="Generation")
    cache = tmp_path / "cache"
    assert _api_run(server, cfg, tmp_path / "o1", cache) == 2
    (seg,) = [os.path.join(r, f) for r, _, fs in os.walk(cache) for f in fs]
    import zlib
    from reform_eval.evaluation.cache import _canonical
    lines = open(seg, "rb").read().splitlines()
    bad = []
    for line in lines:  # a valid checksum of a wrongly shaped value
        entry = json.loads(line)
        entry["v"] = "not-a-dict"
        entry["c"] = zlib.crc32(_canonical("not-a-dict").encode())
        bad.append(json.dumps(entry).encode())
    open(seg, "wb").write(b"\n".join(bad) + b"\n")
    assert _api_run(server, cfg, tmp_path / "o2", cache) == 2


def test_a_cache_dir_that_is_a_file_is_refused_before_any_work(tmp_path, capsys, cache_on):
    (tmp_path / "file").write_text("x")
    rc = run_eval.main(["--model", "random", "--dataset_name", "iWISDM", "--dataset_config", "iwisdm_low",
                        "--dataset_subsample", "2", "--output_dir", str(tmp_path / "o"),
                        "--cache_dir", str(tmp_path / "file")])
    assert rc == 2 and "--cache_dir exists and is not a directory" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("extra", [[], ["--no_cache"]])
def test_a_wrong_image_memo_entry_never_serves_the_other_picture_s_answer(extra, tmp_path, server, cache_on, capsys):
    """The image memo named the old picture's hash for a replaced file (a forged line with a valid
    check sum, or a same-size rewrite within a coarse timestamp tick): the cache key was made from
    it, the file never read, and the sample got the old picture's cached answer. Now the file is
    read before its cached answer is used: the run stops in one line, the entry corrected, and
    the next run asks about the new picture. With --no_cache the model's read found it, fixed the
    memo and went on with the wrong run_id and image_sha: it stops the same way."""
    import reform_eval.utils.file_hashes as fh
    data = tmp_path / "data"
    cfg = write_custom_dataset(str(data), n=2, formulation="Generation")
    cache = tmp_path / "cache"
    assert _api_run(server, cfg, tmp_path / "o1", cache) == 2
    old = fh.hash_bytes_of(str(data / "img0.png"))
    Image.new("RGB", (32, 32), (10, 10, 10)).save(str(data / "img0.png"))  # another picture, same name
    fh._memo._dirs.clear()  # a new process
    folder = fh._memo._memo(str(data), fh._memo.variant()).folder
    key = fh.stat_key(os.stat(data / "img0.png"))
    with open(os.path.join(folder, "seg-vm-1-deadbeef.jsonl"), "w") as f:
        f.write(fh._line("img0.png", key, old))
    fh._memo._dirs.clear()
    capsys.readouterr()
    argv = ["--model", "openai_api", "--model_name", "gpt-test", "--model_option", f"base_url={server.url}",
            "--dataset_name", "custom", "--dataset_config", cfg, "--formulation", "Generation",
            "--output_dir", str(tmp_path / "o2"), "--cache_dir", str(cache), "--do_eval", *extra]
    before = len(server.requests)
    assert run_eval.main(argv) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error")]
    assert len(err) == 1 and "image memo named another content" in err[0] and "img0.png" in err[0], err
    assert not prediction_files(tmp_path / "o2")
    fh._memo._dirs.clear()  # the next process: right
    assert len(server.requests) == before or extra  # (--no_cache: the other sample may have been asked)
    assert _api_run(server, cfg, tmp_path / "o3", cache) == 1  # the new picture is asked about
