"""What servers, disks, schedulers and model hubs do to a run (issue 25, reliability round 4).

Each test pins one class of docs/reliability.md ("The world's conditions"); the class number of
the issue is in the test's name: 1 a checkpoint named by hub id, 2 the world's conditions, 5 the
windows between two writes, 6 long responses, 7 messages that blame the wrong thing. Runs use the
``random`` baseline on a small custom dataset unless a real checkpoint is the point.
"""
from __future__ import annotations

import errno
import glob
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from reform_eval import run_eval
from reform_eval import run_loader_eval
from tests.conftest import prediction_files, write_custom_dataset
from reform_eval.utils.errors import ReformError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def args(cfg, out, *extra):
    return ["--model", "random", "--dataset_name", "custom", "--dataset_config", str(cfg),
            "--formulation", "SingleChoice", "--output_dir", str(out), "--seed", "1", *extra]


def one_line(err: str, code: int, rc: int, *needles: str) -> str:
    """exactly one non-empty stderr line holding every needle, and the exit status ``code``"""
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert rc == code and len(lines) == 1, (rc, err[-3000:])
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


def shard_records(out) -> list:
    return [json.loads(ln) for p in glob.glob(os.path.join(str(out), ".shards_*", "*.jsonl")) for ln in open(p)]


# ------------------------------------------------------------------ 2. the world's conditions
def test_2_reform_cache_below_a_regular_file_is_one_line_naming_the_setting(tmp_path, monkeypatch, capsys):
    """REFORM_CACHE below a regular file: the tiny checkpoint cannot be built there (ENOTDIR,
    'internal error' before) and the response cache folder cannot be made: one line naming
    REFORM_CACHE and the file in the way, exit 2, before any work."""
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    monkeypatch.setenv("REFORM_CACHE", str(blocker / "cache"))
    cfg = write_custom_dataset(str(tmp_path / "data"), n=4)
    rc = run_eval.main(["--model", "llava", "--model_name", "tiny", "--dataset_name", "custom",
                        "--dataset_config", cfg, "--output_dir", str(tmp_path / "out")])
    one_line(capsys.readouterr().err, 2, rc, "REFORM_CACHE", str(blocker), "is a regular file")
    monkeypatch.delenv("REFORM_NO_CACHE", raising=False)  # the response cache on: its folder is probed
    rc = run_eval.main(args(cfg, tmp_path / "out2"))
    one_line(capsys.readouterr().err, 2, rc, "REFORM_CACHE", str(blocker))
    assert not os.path.exists(tmp_path / "out2")


class _FullDiskOS:
    """``os`` as the response cache sees it, on a disk that fills after ``room`` bytes."""

    def __init__(self, room: int) -> None:
        self.room = room

    def __getattr__(self, name):
        return getattr(os, name)

    def write(self, fd, data):
        if len(data) > self.room:
            n = max(self.room, 0)
            os.write(fd, bytes(data[:n]))  # a short write, then the disk is full
            self.room = 0
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room -= len(data)
        return os.write(fd, data)


def test_2_full_disk_of_the_response_cache_keeps_the_answers(tmp_path, monkeypatch, capsys):
    """The disk holding the response cache fills mid-run: one line naming the cache segment and
    --cache_dir (exit 2, not 'internal error'); the batch whose cache write failed is saved in the
    shard; the segment holds only whole lines; the same command then resumes."""
    import reform_eval.evaluation.cache as cache_module
    monkeypatch.delenv("REFORM_NO_CACHE", raising=False)
    cfg = write_custom_dataset(str(tmp_path / "data"), n=12)
    out, cache = tmp_path / "out", tmp_path / "cache"
    monkeypatch.setattr(cache_module, "os", _FullDiskOS(room=400))
    rc = run_eval.main(args(cfg, out, "--cache_dir", str(cache), "--per_gpu_eval_batch_size", "2"))
    line = one_line(capsys.readouterr().err, 2, rc, "No space left on device", "ENOSPC", "(set by --cache_dir)",
                    str(cache), "re-running the same command resumes")
    (segment,) = glob.glob(str(cache / "*" / "seg-*.jsonl"))
    assert os.path.basename(segment) in line
    cached = open(segment, "rb").read()
    assert cached.endswith(b"\n") and len(cached) <= 400  # only whole lines stay
    saved = shard_records(out)
    assert len(saved) > len(cached.splitlines())  # the batch that failed to cache was saved anyway
    monkeypatch.setattr(cache_module, "os", os)
    assert run_eval.main(args(cfg, out, "--cache_dir", str(cache), "--per_gpu_eval_batch_size", "2")) == 0
    (pred,) = prediction_files(out)
    assert len(json.load(open(pred))) == 12


def _mount_tmpfs(path, size: str) -> bool:
    os.makedirs(path, exist_ok=True)
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


def test_2_a_real_full_disk_of_the_response_cache_is_one_line(tmp_path, monkeypatch, capsys):
    """The issue's example on a real full disk (a 16 KiB tmpfs; skipped where mounting needs
    privileges we lack): the response cache's disk fills mid-run: one line naming the segment
    and the way out, exit 2; the answers are kept in the shard (on another disk)."""
    disk = tmp_path / "small"
    if not _mount_tmpfs(disk, "16k"):
        pytest.skip("cannot mount a small tmpfs here (needs root or CAP_SYS_ADMIN)")
    try:
        monkeypatch.delenv("REFORM_NO_CACHE", raising=False)
        cfg = write_custom_dataset(str(tmp_path / "data"), n=400)
        out = tmp_path / "out"
        rc = run_eval.main(args(cfg, out, "--per_gpu_eval_batch_size", "8", "--cache_dir", str(disk / "cache")))
        one_line(capsys.readouterr().err, 2, rc, str(disk / "cache"), "seg-", "No space left on device",
                 "(set by --cache_dir)")
        (segment,) = glob.glob(str(disk / "cache" / "*" / "seg-*.jsonl"))
        assert open(segment, "rb").read().endswith(b"\n")
        assert 0 < len(shard_records(out)) < 400
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True, timeout=30)


@pytest.mark.slow
def test_2_sigterm_to_the_process_group_is_the_interrupt(tmp_path):
    """A scheduler's SIGTERM to the whole process group kills the DataLoader workers too; torch's
    "DataLoader worker ... is killed by signal" must not replace (or follow) the interrupt: one
    line, exit 130, saved answers kept, and the same command completes the run."""
    cfg = write_custom_dataset(str(tmp_path / "data"), n=1000)
    out = tmp_path / "out"
    cmd = [sys.executable, os.path.join(ROOT, "run_eval.py"), *args(cfg, out, "--num_workers", "2",
                                                                      "--per_gpu_eval_batch_size", "1")]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None and not shard_records(out):
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before the signal"
    os.killpg(proc.pid, signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    one_line(err, 130, proc.returncode, "interrupted (SIGTERM)", "samples are saved",
             "re-running the same command resumes")
    saved = len(shard_records(out))
    assert saved >= 1
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    (pred,) = prediction_files(out)
    assert len(json.load(open(pred))) == 1000


def test_2_a_dataloader_worker_killed_for_memory_is_one_line():
    """A worker killed by SIGKILL (the out-of-memory killer) or SIGBUS (/dev/shm too small) is
    the world's condition (exit 2, naming --num_workers); by SIGTERM it is the interrupt."""
    from reform_eval.utils import world
    world.reset()
    oom = RuntimeError("DataLoader worker (pid 4242) is killed by signal: Killed. ")
    assert world.interrupt_of(oom) is None
    assert "--num_workers" in str(world.world_error(oom)) and "SIGKILL" in str(world.world_error(oom))
    term = RuntimeError("DataLoader worker (pid 4242) is killed by signal: Terminated. ")
    assert world.interrupt_of(term) == "SIGTERM" and world.world_error(term) is None
    try:  # torch raises the worker's death while the KeyboardInterrupt is being handled
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise RuntimeError("DataLoader worker (pid(s) 7) exited unexpectedly")
    except RuntimeError as e:
        assert world.interrupt_of(e) == "SIGINT"
    assert world.world_error(ValueError("x")) is None and world.interrupt_of(ValueError("x")) is None


def test_2_mlflow_file_store_is_refused_before_any_work(tmp_path, monkeypatch, capsys):
    """MLflow 3 refuses a file store: the store is opened as logging opens it before anything is
    built or run (not 'internal error while logging to mlflow' after the work)."""
    pytest.importorskip("mlflow", reason="mlflow not installed (pip install '.[mlflow]')")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"file://{tmp_path / 'mlruns'}")
    cfg = write_custom_dataset(str(tmp_path / "data"), n=4)
    out = tmp_path / "out"
    rc = run_eval.main(args(cfg, out, "--do_eval", "--log_to", "mlflow"))
    one_line(capsys.readouterr().err, 2, rc, "--log_to mlflow", f"file://{tmp_path / 'mlruns'}",
             "MLFLOW_TRACKING_URI", "sqlite:///", "nothing was run")
    assert not os.path.exists(out)
    assert run_eval.main(args(cfg, out, "--do_eval")) == 0
    (pred,) = prediction_files(out)
    rc = run_loader_eval.main(["--prediction_file", pred, "--output_dir", str(tmp_path / "re"), "--log_to", "mlflow"])
    one_line(capsys.readouterr().err, 2, rc, "--log_to mlflow", "MLFLOW_TRACKING_URI")
    assert not os.path.exists(tmp_path / "re")


def test_2_a_tracker_refusing_after_the_work_is_one_line_naming_the_saved_results(tmp_path, monkeypatch):
    """A store that accepts the pre-check and then refuses the run: one line (exit 2) saying the
    results are saved and how to log them again."""
    mlflow = pytest.importorskip("mlflow", reason="mlflow not installed (pip install '.[mlflow]')")
    from reform_eval.evaluation.trackers import log_run
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"

    def refuse(*a, **k):
        raise mlflow.exceptions.MlflowException("the store is read-only")
    monkeypatch.setattr(mlflow, "log_params", refuse)
    result = {"metrics": {"accuracy": 0.5}, "config": {"model": "random"}, "per_sample": []}
    with pytest.raises(ReformError) as e:
        log_run("mlflow", result, {"prediction_file": "/x/p.json", "results_json": "/x/p.results.json"},
                tracking_uri=uri)
    text = str(e.value)
    assert text.startswith("--log_to mlflow: the tracking store sqlite:///") and "the store is read-only" in text
    assert "/x/p.results.json" in text and "run_loader_eval --prediction_file /x/p.json --log_to mlflow" in text


def test_2_lone_surrogate_in_a_record_is_stored_and_counted(tmp_path):
    """A reply holding a lone surrogate ("\\ud800") cannot be written as UTF-8: the shard stores
    U+FFFD and counts it (``replaced_chars``); nothing is half-written, no empty shard is left."""
    from reform_eval.utils.predictions import ShardWriter, read_shard_dir
    path = tmp_path / "shards" / "rank0-of-1.jsonl"
    with ShardWriter(str(path), run_id="r1") as w:
        w.write([{"sample_id": "a", "dup_index": 0, "prediction": "x\ud800y"},
                 {"sample_id": "b", "dup_index": 0, "prediction": "\ud83d\ude00 ok"}])
    recs = read_shard_dir(str(tmp_path / "shards"), "r1")
    assert recs[("a", 0)]["prediction"] == "x\ufffdy" and recs[("a", 0)]["replaced_chars"] == 1
    assert recs[("b", 0)]["prediction"] == "\U0001F600 ok" and recs[("b", 0)]["replaced_chars"] == 0
    bad = tmp_path / "nan" / "rank0-of-1.jsonl"
    with pytest.raises(ReformError, match=r"sample 'q' \(duplicate 0\): the record holds a number JSON cannot store"):
        with ShardWriter(str(bad)) as w:
            w.write([{"sample_id": "q", "dup_index": 0, "candidate_logprobs": [float("nan")]}])
    assert not os.path.exists(bad)


# ------------------------------------------------------------------ 7. the right thing blamed
def _fake_forward(monkeypatch, output):
    """The random baseline's forward returning ``output(sample)`` per sample (a stand-in for a
    checkpoint that returns NaN log-probabilities or a server that returns no text)."""
    from reform_eval.models.interfaces.baseline_interface import RandomBaseline
    monkeypatch.setattr(RandomBaseline, "forward", lambda self, method, samples, prompts, **kw:
                        [output(s) for s in samples])


@pytest.mark.parametrize("method,output,needle", [
    ("likelihood", lambda s: [(float("nan"), 1)] * len(s["candidates"]), "log-probability is nan (not a finite number)"),
    ("likelihood", lambda s: [(float("-inf"), 1)] * len(s["candidates"]), "log-probability is -inf"),
    ("likelihood", lambda s: [("-1.5", 1)] * len(s["candidates"]), "is a str, not a number"),
    ("likelihood", lambda s: [(-1.0, -3)] * len(s["candidates"]), "scored token count -3"),
    ("likelihood", lambda s: [(-1.0, 1)], "returned 1 scores for 4 candidates"),
    ("generation", lambda s: None, "the model returned NoneType, not text"),
    ("generation", lambda s: {"text": "A"}, "the model returned dict, not text"),
])
def test_7_bad_model_output_names_the_model_and_the_sample(tmp_path, monkeypatch, capsys, method, output, needle):
    """Non-finite or wrongly typed output is refused where it leaves the model, naming the model
    and the sample (before: the shard reader blamed the shard file, 'number nan is not finite',
    or a later step failed); nothing was written for the batch."""
    _fake_forward(monkeypatch, output)
    cfg = write_custom_dataset(str(tmp_path / "data"), n=4)
    out = tmp_path / "out"
    rc = run_eval.main(args(cfg, out, "--infer_method", method))
    line = one_line(capsys.readouterr().err, 2, rc, "model 'random'", "sample 'q0' (duplicate 0)", needle)
    assert ".jsonl" not in line and "shard" not in line
    assert shard_records(out) == []


# ------------------------------------------------------------------ 1. a checkpoint named by hub id
def _hub_snapshot(hub, repo_id: str, commit: str, files: dict) -> str:
    """A snapshot in the Hugging Face cache layout (blobs, snapshots/<commit>/ of symbolic links,
    refs/main naming the commit), as ``huggingface_hub`` downloads one. ``files``: name -> bytes."""
    import hashlib
    repo = os.path.join(str(hub), "models--" + repo_id.replace("/", "--"))
    snap = os.path.join(repo, "snapshots", commit)
    os.makedirs(os.path.join(repo, "blobs"), exist_ok=True)
    os.makedirs(os.path.join(repo, "refs"), exist_ok=True)
    for name, data in files.items():
        blob = os.path.join(repo, "blobs", hashlib.sha256(data).hexdigest())
        with open(blob, "wb") as f:
            f.write(data)
        link = os.path.join(snap, name)
        os.makedirs(os.path.dirname(link), exist_ok=True)
        os.symlink(os.path.relpath(blob, os.path.dirname(link)), link)
    with open(os.path.join(repo, "refs", "main"), "w") as f:
        f.write(commit)
    return snap


C1, C2 = "1" * 40, "2" * 40


def test_1_a_hub_id_is_fingerprinted_by_its_snapshot(tmp_path, monkeypatch):
    """``--model_name org/model`` resolves (offline, refs/main -> snapshots/<commit>) to the
    snapshot the cache holds; the run identity fingerprints its files like a local folder's, so
    new weights under the same id are a new identity (before: no fingerprint at all)."""
    from reform_eval.evaluation.config import ModelConfig
    from reform_eval.evaluation.plan import checkpoint_fingerprint
    from reform_eval.models import checkpoint_source
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    _hub_snapshot(tmp_path / "hub", "org/model", C1, {"config.json": b'{"a": 1}', "model.safetensors": b"w1"})
    first = checkpoint_fingerprint(ModelConfig("llava", name="org/model"))
    assert first and sorted(n for n, *_ in first) == ["config.json", "model.safetensors"]
    assert checkpoint_source("llava", "org/model").commit == C1
    _hub_snapshot(tmp_path / "hub", "org/model", C2, {"config.json": b'{"a": 1}', "model.safetensors": b"w2-new"})
    second = checkpoint_fingerprint(ModelConfig("llava", name="org/model"))
    assert second and second != first and checkpoint_source("llava", "org/model").commit == C2
    assert checkpoint_source("random", "org/model") is None  # not a Hugging Face family: no lookup
    assert checkpoint_source("llava", "org/not-cached") is None


@pytest.mark.slow
def test_1_new_snapshot_under_one_hub_id_is_a_new_run_and_a_cache_miss(tmp_path):
    """The issue's example end to end: a tiny LLaVA in a fake HF cache under ``org/tiny-llava``;
    after a second snapshot arrives under the same id, the same command is a new run (a new
    prediction file, not the old predictions) and every model call a response-cache miss (not
    old answers); the run info records the commit each run loaded."""
    from reform_eval.models.tiny import tiny_model_path
    src = tiny_model_path("llava")
    files = {}
    for root, _, names in os.walk(src):
        for n in names:
            rel = os.path.relpath(os.path.join(root, n), src)
            files[rel] = open(os.path.join(root, n), "rb").read()
    hub = tmp_path / "hub"
    _hub_snapshot(hub, "org/tiny-llava", C1, files)
    cfg = write_custom_dataset(str(tmp_path / "data"), n=4)
    out = tmp_path / "out"
    argv = ["--model", "llava", "--model_name", "org/tiny-llava", "--dataset_name", "custom", "--dataset_config", cfg,
            "--infer_method", "likelihood", "--output_dir", str(out), "--cache_dir", str(tmp_path / "cache")]
    env = {k: v for k, v in os.environ.items() if k != "REFORM_NO_CACHE"}
    env.update(HF_HUB_CACHE=str(hub), HF_HUB_OFFLINE="1")  # as a user sets it: before anything is imported

    def run() -> None:
        done = subprocess.run([sys.executable, os.path.join(ROOT, "run_eval.py"), *argv], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]

    def run_info(pred):
        return json.load(open(pred[:-5] + ".run.json"))
    run()
    (first,) = prediction_files(out)
    assert run_info(first)["response_cache"]["misses"] == 4
    config = json.loads(files["config.json"])
    config["reform_test_revision"] = 2  # new files under the same id (any file counts)
    _hub_snapshot(hub, "org/tiny-llava", C2, dict(files, **{"config.json": json.dumps(config).encode()}))
    run()
    files_now = prediction_files(out)
    assert len(files_now) == 2, files_now  # a new run identity, not the old predictions
    (second,) = [f for f in files_now if f != first]
    info = run_info(second)
    assert info["response_cache"]["misses"] == 4 and info["response_cache"].get("hits", 0) == 0
    assert info["checkpoint_source"]["commit"] == C2
    assert run_info(first)["checkpoint_source"] == {"hub_id": "org/tiny-llava", "revision": "main", "commit": C1,
                                                    "snapshot": os.path.join(str(hub), "models--org--tiny-llava",
                                                                             "snapshots", C1)}


# ------------------------------------------------------------------ 5. windows between two writes
_MUTATIONS = ("rename", "replace", "unlink", "rmdir")


def _crash_after(k: int, under: str, argv: list) -> int:
    """In a forked child: run ``run_eval`` with the process killed (``os._exit``, no clean-up of
    any kind) right after its k-th file-system step under ``under`` (a rename, replace, unlink,
    rmdir or rmtree); returns the child's exit status (77: killed there; 0: the run had fewer steps)."""
    import shutil
    pid = os.fork()
    if pid == 0:
        try:
            count = [0]

            def counted(fn):
                def step(path, *a, **kw):
                    out = fn(path, *a, **kw)
                    if isinstance(path, str) and os.path.abspath(path).startswith(under):
                        count[0] += 1
                        if count[0] == k:
                            os._exit(77)
                    return out
                return step
            for name in _MUTATIONS:
                setattr(os, name, counted(getattr(os, name)))
            shutil.rmtree = counted(shutil.rmtree)
            sys.stdout = sys.stderr = open(os.devnull, "w")
            os._exit(run_eval.main(argv))
        except BaseException:  # noqa: BLE001
            os._exit(99)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def _leftovers(out) -> list:
    found = []
    for root, dirs, files in os.walk(str(out)):
        found += [os.path.join(root, n) for n in dirs + files if n.startswith((".tmp-", ".commit~", ".shards_"))]
    return found


@pytest.mark.slow  # (minutes of the quick subset; the full suite runs it)
@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_5_a_kill_at_every_step_of_the_commit_is_completed_or_rolled_back(tmp_path):
    """run_eval --do_eval killed right after each of its file-system steps after the model ran
    (the prediction file written, the shards removed, every staged output renamed, the index line,
    the journal): the start-up clean-up leaves no mix of one unit's outputs (all of them or none),
    and the next start of the same command ends with exactly the outputs of a clean run: no shard,
    temporary or journal left, the results equal, each index line once."""
    cfg = write_custom_dataset(str(tmp_path / "data"), n=4)
    ref = tmp_path / "ref"
    assert run_eval.main(args(cfg, ref, "--do_eval")) == 0
    (ref_pred,) = prediction_files(ref)
    want = json.load(open(ref_pred[:-5] + ".results.json"))["metrics"]
    stem = os.path.basename(ref_pred)[:-5]
    unit = [f"{stem}.results.json", f"{stem}.results.md", f"{stem}.per_sample.json",
            f"{stem}.report/report.html", f"{stem}.report/comparison.json", f"{stem}.report/plots"]
    from reform_eval.utils.commit import clean_stale_temps
    k = 0
    while True:
        k += 1
        assert k < 60, "the run never finished without a kill"
        out = tmp_path / f"out{k}"
        under = os.path.abspath(str(out))
        status = _crash_after(k, under, args(cfg, out, "--do_eval"))
        if status == 0:
            break
        assert status == 77, status
        clean_stale_temps(str(out), depth=2)  # what any command does first in this folder
        present = [u for u in unit if os.path.lexists(out / u)]
        assert present in ([], unit), (k, present)  # never half of a unit
        assert run_eval.main(args(cfg, out, "--do_eval")) == 0, k
        assert _leftovers(out) == [], (k, _leftovers(out))
        assert [u for u in unit if not os.path.lexists(out / u)] == [], k
        assert json.load(open(out / f"{stem}.results.json"))["metrics"] == want, k
        index = [json.loads(ln) for ln in open(out / "runs.jsonl", encoding="utf-8")]
        ids = [e["commit"] for e in index if "commit" in e]
        assert len(ids) == len(set(ids)) == len(index), (k, index)
    assert k > 8  # every step was tried: merge, shard removal, journal, each rename, index, journal removal


# ------------------------------------------------------------------ 6. long responses
def test_6_every_response_is_whole_in_per_sample(tmp_path):
    """A 1 MB response stays whole in ``per_sample.json``: where scoring reads less of it
    (``--strip_reasoning`` on a reasoning block that ran to the end: nothing is left to score)
    the entry keeps the whole text as ``raw_prediction``; several responses per sample are kept
    whole as ``predictions``."""
    long = "<think>" + "step " * 200_000  # 1 MB of reasoning, cut off before any answer
    records = [
        {"sample_id": "a", "answer": "red", "prediction": long, "predictions": [long, "red"]},
        {"sample_id": "b", "answer": "blue", "prediction": "blue " + "x" * 1_000_000},
    ]
    for r in records:
        r.update(formulation="Generation", inference_method="generation", benchmark="custom")
    pred = tmp_path / "preds.json"
    pred.write_text(json.dumps(records), encoding="utf-8")
    assert run_loader_eval.main(["--prediction_file", str(pred), "--strip_reasoning"]) == 0
    (per_sample,) = glob.glob(str(tmp_path / "*.per_sample.json"))
    entries = {e["sample_id"]: e for e in json.load(open(per_sample, encoding="utf-8"))}
    a, b = entries["a"], entries["b"]
    assert a["prediction"] == "" and a["raw_prediction"] == long  # scored: nothing; kept: all of it
    assert a["predictions"] == [long, "red"]
    assert b["prediction"] == records[1]["prediction"] and "raw_prediction" not in b


def test_2_an_interrupt_that_reaches_the_boundary_still_counts_what_is_saved(capsys):
    """A scheduler's SIGTERM kills the DataLoader workers too: when torch's worker-death error
    overtook the run's own interrupt handler (it was raised inside that handler, once in CI), the
    interrupt reached the command line's boundary and its line lost the count of saved samples.
    Both ways now say it in the same words (``utils.world.interrupted_line``)."""
    from reform_eval.evaluation.boundary import run_cli
    from reform_eval.utils import world

    def body() -> int:
        done = {("a", 0), ("b", 0)}
        world.note_progress(lambda: f"{len(done)} of 5 samples are saved")
        world.note_signal(signal.SIGTERM)
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:  # the run's handler, overtaken by a worker's death inside it
            raise RuntimeError("DataLoader worker (pid(s) 123) exited unexpectedly")
    assert run_cli(body, "run_eval") == 130
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == ["error: interrupted (SIGTERM): 2 of 5 samples are saved; re-running the same command "
                     "resumes from there"]
    assert run_cli(lambda: (_ for _ in ()).throw(KeyboardInterrupt()), "run_eval") == 130  # a new command: no count
    assert capsys.readouterr().err.strip() == ("error: interrupted while starting; re-running the same command "
                                               "resumes from the samples already saved")


def test_2_a_stopped_run_whose_shutdown_hangs_still_ends_with_its_line():
    """A run stopped by SIGTERM must end: once in CI, one stopped by SIGTERM to its process group
    never exited. A watchdog started by the first signal ends a command-line process that is still
    there after the grace (here 0.5 s), with the one line counting what is saved and status 130."""
    child = ("import os, signal, sys, threading\n"
             "from reform_eval.evaluation import boundary as b\n"
             "from reform_eval.utils import world\n"
             "from reform_eval.utils.distributed import process_ends_after_run\n"
             "process_ends_after_run(); b.STOP_GRACE_S = 0.5\n"
             "def body():\n"
             "    world.note_progress(lambda: '3 of 9 samples are saved')\n"
             "    try:\n"
             "        os.kill(os.getpid(), signal.SIGTERM)\n"
             "        threading.Event().wait()\n"
             "    finally:\n"
             "        threading.Event().wait()  # a shutdown that waits for ever\n"
             "sys.exit(b.run_cli(body, 'run_eval'))\n")
    proc = subprocess.run([sys.executable, "-c", child], env=dict(os.environ, PYTHONPATH=ROOT), cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    one_line(proc.stderr, 130, proc.returncode, "interrupted (SIGTERM): 3 of 9 samples are saved")
