"""run_eval end to end: outputs, resume, torchrun equivalence, offline re-scoring, bad input."""
import json
import os
import subprocess
import sys

import pytest

from reform_eval import run_eval
from reform_eval.run_loader_eval import loader_eval
from tests.conftest import prediction_files, results_of

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def base_args(cfg, out, *extra):
    return ["--model", "random", "--dataset_name", "custom", "--dataset_config", cfg,
            "--formulation", "SingleChoice", "--output_dir", str(out), "--dataset_duplication", "3",
            "--seed", "5", *extra]


def pred_file(out):
    files = [f for f in prediction_files(out) if os.path.basename(f).startswith("custom_")]
    assert len(files) == 1, files
    return files[0]


def test_outputs_and_loader_eval_agree(custom_cfg, tmp_path):
    out = tmp_path / "out"
    assert run_eval.main(base_args(custom_cfg, out, "--do_eval", "--eval_stability")) == 0
    preds = json.load(open(pred_file(out)))
    assert len(preds) == 36
    assert [(p["sample_id"], p["dup_index"]) for p in preds] == [(f"q{i}", d) for i in range(12) for d in range(3)]
    assert all("images" not in p and p["image_ids"][0].endswith(f"img{p['sample_id'][1:]}.png") for p in preds)
    res = results_of(pred_file(out))
    assert res["config"]["seed"] == 5 and res["seed"] == 5
    assert res["versions"]["torch"] and "git_revision" in res
    assert res["metrics"]["num_records"] == 36
    # accuracy recomputed by hand from the records
    acc = sum(p["answer_options"][p["answer"]] == p["answer_options"][" ABCD".index(p["prediction"][1]) - 1]
              for p in preds) / 36
    assert res["metrics"]["accuracy"] == pytest.approx(acc)
    again = loader_eval(pred_file(out), eval_stability=True, output_dir=str(tmp_path / "re"), quiet=True)
    assert again["metrics"] == res["metrics"]
    stem = os.path.basename(pred_file(out))[:-5]
    names = set(os.listdir(out))
    assert {"log.txt", "runs.jsonl"} <= names
    # scored with --eval_stability (not the default options): <stem>.eval-<hash>.results.*
    assert any(n.startswith(stem + ".eval-") and n.endswith(".results.md") for n in names)
    assert any(n.startswith(stem + ".eval-") and n.endswith(".per_sample.json") for n in names)


def test_rerun_does_not_overwrite(custom_cfg, tmp_path):
    out = tmp_path / "out"
    assert run_eval.main(base_args(custom_cfg, out)) == 0
    path = pred_file(out)
    with open(path, "a") as f:
        f.write(" ")  # marker: must survive a re-run without --overwrite
    before = open(path).read()
    assert run_eval.main(base_args(custom_cfg, out)) == 0
    assert open(path).read() == before
    assert run_eval.main(base_args(custom_cfg, out, "--overwrite")) == 0
    assert open(path).read() != before


def test_resume_from_partial_shards(custom_cfg, tmp_path):
    """A torn shard (as after a kill) is completed by re-running, with nothing lost or doubled."""
    full = tmp_path / "full"
    assert run_eval.main(base_args(custom_cfg, full)) == 0
    expected = json.load(open(pred_file(full)))
    part = tmp_path / "part"
    digest = os.path.basename(pred_file(full)).rsplit("_", 1)[1][:-5]
    shard_dir = part / f".shards_{digest}"
    shard_dir.mkdir(parents=True)
    lines = [json.dumps(r) for r in expected]
    (shard_dir / "rank0-of-2.jsonl").write_text("\n".join(lines[0:20:2]) + "\n" + lines[20][:30])
    (shard_dir / "rank1-of-2.jsonl").write_text("\n".join(lines[1:9:2]) + "\n")
    assert run_eval.main(base_args(custom_cfg, part)) == 0
    assert json.load(open(pred_file(part))) == expected
    assert not shard_dir.exists()


def torchrun(args, env_extra=None):
    env = dict(os.environ, OMP_NUM_THREADS="1", **(env_extra or {}))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           os.path.join(ROOT, "run_eval.py"), *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env, timeout=300)


def test_torchrun_matches_single_process(custom_cfg, tmp_path):
    single, multi = tmp_path / "single", tmp_path / "multi"
    assert run_eval.main(base_args(custom_cfg, single)) == 0
    proc = torchrun(base_args(custom_cfg, multi))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert open(pred_file(single)).read() == open(pred_file(multi)).read()


def png_with_corrupt_pixels() -> bytes:
    """A PNG whose header and chunk checksums are right but whose pixel stream is not deflate
    data: it passes the header-and-verify check of the run's fingerprint and fails only when a
    model decodes it, mid-run on one rank."""
    import io
    import struct
    import zlib
    from PIL import Image
    buf = io.BytesIO()
    Image.new("RGB", (8, 8), (1, 2, 3)).save(buf, format="PNG")
    png = buf.getvalue()
    at = png.index(b"IDAT") - 4
    size = struct.unpack(">I", png[at:at + 4])[0]
    data = b"\x78\x9c" + b"not deflate data" * 3
    chunk = struct.pack(">I", len(data)) + b"IDAT" + data + struct.pack(">I", zlib.crc32(b"IDAT" + data))
    return png[:at] + chunk + png[at + 12 + size:]


@pytest.mark.slow  # (multi-process; the quick subset keeps a lighter test of the same path)
def test_torchrun_failure_stops_all_ranks(custom_cfg, tmp_path):
    """A rank that fails mid-run (here: a sample whose pixels are corrupt, met by a model that
    decodes its images) stops the run with the error."""
    data = os.path.dirname(custom_cfg)
    with open(os.path.join(data, "img3.png"), "wb") as f:
        f.write(png_with_corrupt_pixels())
    args = base_args(custom_cfg, tmp_path / "o") + ["--per_gpu_eval_batch_size", "1"]
    args[args.index("random")] = "llava"
    args[2:2] = ["--model_name", "tiny"]
    proc = torchrun(args)
    assert proc.returncode != 0
    assert "img3.png: image cannot be decoded" in proc.stderr
    assert not [f for f in os.listdir(tmp_path / "o") if f.endswith(".json") and f.startswith("custom_")]
    assert proc.stderr.strip().splitlines()[-1].count("img3.png: image cannot be decoded") == 1 or \
        "image cannot be decoded" in proc.stderr


@pytest.mark.slow  # (multi-process)
def test_a_torchrun_rank_ends_without_tearing_its_group_down(custom_cfg, tmp_path):
    """Tearing gloo down while a peer tears down its own aborted a rank now and then after the
    final barrier ("terminate called without an active exception", exit -6): a finished run
    failed. The command line's rank now ends without any teardown (``utils.distributed.
    end_process``); here a teardown aborts the process, as the one in CI did, and the run still
    ends with 0 and its predictions."""
    script = tmp_path / "aborting_teardown.py"
    script.write_text(
        "import os, sys\n"
        f"sys.path.insert(0, {ROOT!r})\n"
        "import torch.distributed as dist\n"
        "dist.destroy_process_group = lambda *a, **k: os.abort()\n"
        "from reform_eval import run_eval\n"
        "run_eval.cli()\n")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script),
           *base_args(custom_cfg, tmp_path / "o")]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "predictions:" in proc.stdout
    assert len(json.load(open(pred_file(tmp_path / "o")))) > 0


def test_a_single_process_ends_with_its_teardown_but_without_rescanning_the_heap():
    """A command line's single process exits the usual way (atexit handlers run: the log closed,
    temporary folders removed) but its teardown's garbage collections skip the objects alive at
    the end (``gc.freeze``): torch and transformers hold millions, scanning them took 1-2 s of
    every run's exit."""
    probe = ("import atexit, gc, sys\n"
             f"sys.path.insert(0, {ROOT!r})\n"
             "from reform_eval.utils.distributed import end_process\n"
             "atexit.register(lambda: print('frozen', gc.get_freeze_count() > 0, flush=True))\n"
             "end_process(3)\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout.strip()) == (3, "frozen True"), done.stderr[-2000:]


def cli(script, *args):
    return subprocess.run([sys.executable, os.path.join(ROOT, script), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.slow  # (minutes of the quick subset; the full suite runs it)
def test_loader_eval_bad_inputs(tmp_path):
    good = {"sample_id": "a", "dup_index": 0, "benchmark": "custom", "formulation": "SingleChoice",
            "inference_method": "generation", "answer_options": ["x", "y"], "option_marks": ["A", "B"],
            "answer": 0, "prediction": "(A)"}
    cases = {
        "malformed.json": ("[{\"sample_id\": ", "malformed.json: malformed JSON at line 1"),
        "nosid.json": (json.dumps([{k: v for k, v in good.items() if k != "sample_id"}]),
                       "nosid.json: record 0: field 'sample_id': missing"),
        "noanswer.json": (json.dumps([good, {k: v for k, v in dict(good, sample_id="b").items() if k != "answer"}]),
                          "noanswer.json: record 1: field 'answer': missing"),
        "range.json": (json.dumps([dict(good, answer=5)]), "range.json: record 0: field 'answer'"),
        "type.json": (json.dumps([dict(good, prediction=["A"])]), "type.json: record 0: field 'prediction'"),
    }
    for name, (content, message) in cases.items():
        d = tmp_path / name.split(".")[0]
        d.mkdir()
        (d / name).write_text(content)
        proc = cli("run_loader_eval.py", "--prediction_file", str(d / name))
        assert proc.returncode == 2, (name, proc.stderr)
        assert message in proc.stderr, (name, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert sorted(os.listdir(d)) == [name]  # nothing half-written beside it
    # JSONL is accepted and scores like the array
    (tmp_path / "ok.jsonl").write_text(json.dumps(good) + "\n" + json.dumps(dict(good, sample_id="b", prediction="(B)")) + "\n")
    res = loader_eval(str(tmp_path / "ok.jsonl"), quiet=True)
    assert res["metrics"]["accuracy"] == 0.5


def test_run_eval_unknown_names(custom_cfg, tmp_path):
    proc = cli("run_eval.py", "--model", "nosuchmodel", "--dataset_name", "custom", "--output_dir", str(tmp_path))
    assert proc.returncode == 2 and "unknown model 'nosuchmodel'; valid names:" in proc.stderr and "random" in proc.stderr
    proc = cli("run_eval.py", "--model", "random", "--dataset_name", "NoBench", "--output_dir", str(tmp_path))
    assert proc.returncode == 2 and "unknown dataset 'NoBench'; valid names:" in proc.stderr
    proc = cli("run_eval.py", "--model", "random", "--dataset_name", "custom", "--dataset_config", custom_cfg,
               "--formulation", "Essay", "--output_dir", str(tmp_path))
    assert proc.returncode == 2 and "unknown formulation 'Essay'" in proc.stderr
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".json")]


def test_constant_baseline_scores_first_option(custom_cfg, tmp_path):
    """`constant` always answers the first shown option: its accuracy is the share of samples
    whose correct option was shuffled into first place, for generation and likelihood alike."""
    for method in ("generation", "likelihood"):
        out = tmp_path / method
        args = base_args(custom_cfg, out, "--do_eval", "--infer_method", method)
        args[args.index("random")] = "constant"
        assert run_eval.main(args) == 0
        preds = json.load(open(pred_file(out)))
        expected = sum(p["answer"] == 0 for p in preds) / len(preds)
        assert 0 < expected < 1
        assert results_of(pred_file(out))["metrics"]["accuracy"] == pytest.approx(expected)
        if method == "generation":
            assert {p["prediction"] for p in preds} == {"(A)"}
        else:
            assert {p["prediction"] for p in preds} == {0}
