"""MMMT-IF through run_eval: own answers as history, N=4 samples, 2 ranks, kill and resume."""
import glob
import json
import os
import subprocess
import sys

import pytest
from PIL import Image

from tests.conftest import only_results, prediction_files
from tests.test_kill_resume import run_and_kill_midway

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def write_mmdu(root):
    """Six chats of five turns with two images each, in MMDU's benchmark.json format."""
    img = os.path.join(root, "images")
    os.makedirs(img)
    for i in range(4):
        Image.new("RGB", (16, 16), (60 * i, 255 - 60 * i, 90)).save(os.path.join(img, f"p{i}.png"))
    chats = []
    for c in range(6):
        convs = []
        for t in range(5):
            q = ("Image1: <ImageHere>. Image2: <ImageHere>. What differs between Image1 and Image2?"
                 if t == 0 else f"Tell me more about detail {t} of the pictures.")
            convs += [{"from": "user", "value": q}, {"from": "assistant", "value": f"Reference {c}-{t}."}]
        chats.append({"id": f"chat{c}", "image": [f"p{c % 4}.png", f"p{(c + 1) % 4}.png"], "conversations": convs})
    with open(os.path.join(root, "benchmark.json"), "w") as f:
        json.dump(chats, f)
    cfg = os.path.join(root, "mmmt_if.yaml")
    with open(cfg, "w") as f:
        f.write("source: mmdu\nmmdu_json: benchmark.json\nimage_folder: images\n")
    return cfg


def run_args(cfg, out):
    return ["--model", "llava", "--model_name", "tiny", "--dataset_name", "MMMT-IF", "--dataset_config", cfg,
            "--num_samples", "4", "--temperature", "1.0", "--max_new_tokens", "24", "--seed", "7",
            "--per_gpu_eval_batch_size", "2", "--output_dir", str(out), "--do_eval"]


@pytest.mark.slow  # (multi-process; the quick subset keeps a lighter test of the same path)
def test_multi_turn_two_ranks_kill_resume(tmp_path):
    cfg = write_mmdu(str(tmp_path / "mmdu"))
    env = dict(os.environ, OMP_NUM_THREADS="1")
    single = tmp_path / "single"
    done = subprocess.run([sys.executable, os.path.join(ROOT, "run_eval.py"), *run_args(cfg, single)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    records = json.load(open(prediction_files(single)[0]))
    assert len(records) == 30
    by_id = {r["sample_id"]: r for r in records}
    for r in records:
        assert len(r["predictions"]) == 4 and r["prediction"] == r["predictions"][0]
        sources = [t for t in r["history"] if t["from"] == "assistant"]
        assert len(sources) == r["meta"]["turn"] - 1
        for t in sources:  # history holds the model's own earlier answers, not the references
            assert t["value"] == by_id[t["source_sample_id"]]["prediction"]
            assert not t["value"].startswith("Reference")
    assert any(len(set(r["predictions"])) > 1 for r in records)  # sampling at temperature 1
    res = only_results(single)["metrics"]
    for key in ("pif", "pif_4_1", "pif_4_2", "pif_4_3", "pif_4_4", "pif_iqr_4"):
        assert key in res, key
    assert res["pif_4_1"] >= res["pif_4_2"] >= res["pif_4_3"] >= res["pif_4_4"]

    out = tmp_path / "killed"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           os.path.join(ROOT, "run_eval.py"), *run_args(cfg, out)]
    partial = run_and_kill_midway(cmd, out, 4, env)
    assert not prediction_files(out), "the run finished before the kill"
    assert 4 <= partial < 30
    again = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    resumed = json.load(open(prediction_files(out)[0]))
    assert resumed == records
    assert only_results(out)["metrics"]["pif"] == res["pif"]


def test_reference_baseline_answers_with_the_mmdu_reference(tmp_path, capsys):
    """--model reference: every answer is the sample's MMDU reference; PIF is scored on it."""
    from reform_eval import run_eval
    from reform_eval.metrics.pif import pif
    cfg = write_mmdu(str(tmp_path / "mmdu"))
    out = tmp_path / "ref"
    rc = run_eval.main(["--model", "reference", "--dataset_name", "MMMT-IF", "--dataset_config", cfg,
                        "--formulation", "Generation", "--infer_method", "generation", "--seed", "3",
                        "--output_dir", str(out), "--do_eval"])
    assert rc == 0
    records = json.load(open(prediction_files(out)[0]))
    assert len(records) == 30
    for r in records:
        chat, turn = int(r["meta"]["chat_id"][4:]), r["meta"]["turn"]
        assert r["prediction"] == f"Reference {chat}-{turn - 1}."
    expected = sum(pif(r["prediction"], r["meta"]["instructions"]) for r in records) / len(records)
    res = [json.load(open(p)) for p in glob.glob(os.path.join(out, "*results.json"))]
    assert res and res[0]["metrics"]["pif"] == pytest.approx(expected)
    # the release CSV alone has no reference answers: one clear line, exit 2
    import csv
    with open(os.path.join(ROOT, "configs", "data", "mmmt_if_release.csv"), encoding="utf-8", newline="") as f:
        reader = csv.reader(f)
        head = [next(reader), next(reader)]
    with open(tmp_path / "one.csv", "w", encoding="utf-8", newline="") as f:
        csv.writer(f).writerows(head)
    rc = run_eval.main(["--model", "reference", "--dataset_name", "MMMT-IF", "--dataset_option", "source=release_only",
                        "--dataset_option", f"release_csv={tmp_path / 'one.csv'}", "--output_dir", str(tmp_path / "none")])
    assert rc == 2 and "needs a reference answer" in capsys.readouterr().err


@pytest.mark.slow
def test_mmmt_if_script_runs_with_tiny(tmp_path):
    """commands/mmmt_if_llava.sh on the release's questions (one 2-turn chat): tiny's answers
    are capped at 16 tokens so the chat fits its context; the headline prints, the PIF tables are in
    results.md."""
    import csv
    with open(os.path.join(ROOT, "configs", "data", "mmmt_if_release.csv"), encoding="utf-8", newline="") as f:
        rows = list(csv.reader(f))
    with open(tmp_path / "chat55.csv", "w", encoding="utf-8", newline="") as f:
        csv.writer(f).writerows([rows[0]] + [r for r in rows[1:] if r[0] == "55"])
    env = dict(os.environ, PYTHON=sys.executable, OMP_NUM_THREADS="1")
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    done = subprocess.run(["bash", os.path.join(ROOT, "commands", "mmmt_if_llava.sh"), "--dataset_config",
                           "configs/datasets/mmmt_if_release_only.yaml", "--dataset_option",
                           f"release_csv={tmp_path / 'chat55.csv'}", "--output_dir", str(tmp_path / "out")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "| pif |" in done.stdout and ".results.md" in done.stdout
    (md,) = [os.path.join(tmp_path / "out", n) for n in os.listdir(tmp_path / "out") if n.endswith(".results.md")]
    assert "MMMT-IF PIF by turn" in open(md, encoding="utf-8").read()
    records = json.load(open(prediction_files(tmp_path / "out")[0]))
    assert [r["sample_id"] for r in records] == ["55-t01", "55-t02"]
    assert all(len(r["predictions"]) == 4 for r in records)
