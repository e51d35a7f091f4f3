"""Shared fixtures: a small custom-format dataset written by the tests."""
from __future__ import annotations

import json
import os
import sys

import pytest
from PIL import Image

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
os.environ.setdefault("REFORM_CACHE", os.path.join(ROOT, ".cache", "reform_eval"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# the response cache would serve one test's model calls to another and hide the model path under
# test; tests of the cache pass --cache_dir and unset this
os.environ.setdefault("REFORM_NO_CACHE", "1")

COLOURS = ["red", "green", "blue", "yellow"]


def write_custom_dataset(directory: str, n: int = 12, formulation: str = "SingleChoice") -> str:
    """n items: an image of one colour and the question which colour it is. Returns the YAML path."""
    os.makedirs(directory, exist_ok=True)
    rgb = {"red": (220, 30, 30), "green": (30, 200, 30), "blue": (30, 30, 220), "yellow": (230, 220, 30)}
    lines = []
    for i in range(n):
        colour = COLOURS[i % 4]
        name = f"img{i}.png"
        Image.new("RGB", (32, 32), rgb[colour]).save(os.path.join(directory, name))
        rec = {"sample_id": f"q{i}", "images": [name], "question": "Which colour fills the image?",
               "meta": {"colour": colour}}
        if formulation == "SingleChoice":
            rec.update(answer_options=list(COLOURS), answer=COLOURS.index(colour))
        else:
            rec.update(answer=colour, candidates=list(COLOURS))
        lines.append(json.dumps(rec))
    with open(os.path.join(directory, "items.jsonl"), "w") as f:
        f.write("\n".join(lines) + "\n")
    cfg = os.path.join(directory, "custom.yaml")
    with open(cfg, "w") as f:
        f.write("data_file: items.jsonl\n")
    return cfg


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    """A private REFORM_CACHE for one test module, so it builds its tiny models itself
    (and checks the builders) without touching the shared cache."""
    old = os.environ.get("REFORM_CACHE")
    path = str(tmp_path_factory.mktemp("reform_cache"))
    os.environ["REFORM_CACHE"] = path
    yield path
    if old is None:
        os.environ.pop("REFORM_CACHE", None)
    else:
        os.environ["REFORM_CACHE"] = old


@pytest.fixture
def custom_cfg(tmp_path):
    return write_custom_dataset(str(tmp_path / "data"))


def prediction_files(out) -> list:
    """The prediction files in an output directory: the library's one lookup of a run's files
    (``evaluation.reporting.scoring.prediction_files``), with a path object accepted."""
    from evaluation.reporting.scoring import prediction_files as found
    return found(str(out))


def results_of(pred: str, tag: str = "") -> dict:
    """The results run_eval wrote for a prediction file (``<stem>.results.json``, or its one
    ``<stem>.eval-<hash>.results.json`` when scored with other options), or those with ``tag``."""
    from evaluation.reporting.scoring import results_files, results_paths
    paths = results_paths(str(pred), tag=tag or None)
    path = paths["json"]
    if not tag and not os.path.exists(path):
        found = [p for p in results_files(str(pred)) if os.path.basename(p).startswith(paths["stem"] + ".eval-")]
        assert len(found) == 1, found
        path = found[0]
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def only_results(directory) -> dict:
    """The one results file in ``directory`` (``*.results.json``, else a run without --do_eval's
    ``*.run.json``); fails when there is none or more than one."""
    names = sorted(os.listdir(directory))
    found = [n for n in names if n.endswith(".results.json")] or [n for n in names if n.endswith(".run.json")]
    assert len(found) == 1, names
    with open(os.path.join(str(directory), found[0]), encoding="utf-8") as f:
        return json.load(f)


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "slow: takes over ~20 s; `bash commands/test.sh -m 'not slow'` is the quick subset")
    config.addinivalue_line("markers", "background(cmd): the test's command starts in a background process as soon "
                            "as collection ends and runs beside the rest of the suite (see background_result)")


#: background commands started after collection: marker args -> (process, stdout file, stderr file, folder)
_BACKGROUND: dict = {}


def _skipped(item) -> bool:
    """Whether a ``skipif`` marker of the item holds (its test would skip: no job to start)."""
    return any(m.args and isinstance(m.args[0], bool) and m.args[0] for m in item.iter_markers("skipif"))


def pytest_collection_modifyitems(session, config, items) -> None:
    """Tests that wait for a background job run last, so the job has the whole suite to finish in."""
    items.sort(key=lambda item: item.get_closest_marker("background") is not None)


def _background_child() -> None:
    """In the background job: lowest CPU priority (it takes what the suite leaves idle), and
    killed when pytest dies."""
    from evaluation.execute import die_with_parent
    os.nice(19)
    die_with_parent()


def pytest_collection_finish(session) -> None:
    """Start the ``background`` command of each test that will run (after -k/-m deselection and
    skipif), so a long, independent job (the known-skill model's retraining) runs on the CPU the
    suite leaves idle instead of adding to its time. The job runs at the lowest priority in its
    own process group, dies with this process (PR_SET_PDEATHSIG) and is killed at the end of the
    session; its test runs last."""
    import subprocess
    import tempfile
    for item in session.items:
        marker = item.get_closest_marker("background")
        if marker is None or marker.args in _BACKGROUND or _skipped(item):
            continue
        work = tempfile.mkdtemp(prefix="reform-bg-")
        cmd = [a.replace("{tmp}", work) for a in marker.args]
        out = open(os.path.join(work, "stdout"), "w+")
        err = open(os.path.join(work, "stderr"), "w+")
        env = dict(os.environ, OMP_NUM_THREADS="1")
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=err, env=env, start_new_session=True,
                                preexec_fn=_background_child)
        _BACKGROUND[marker.args] = (proc, out, err, work)


def background_result(request, timeout: float = 1800.0):
    """(return code, stdout, stderr, work folder) of the test's background command, waiting for it."""
    proc, out, err, work = _BACKGROUND[request.node.get_closest_marker("background").args]
    proc.wait(timeout=timeout)
    out.seek(0)
    err.seek(0)
    return proc.returncode, out.read(), err.read(), work


def pytest_sessionfinish(session, exitstatus) -> None:
    """A background command still running (its test deselected late, failed early or
    interrupted) is killed with its process group; its folder is removed."""
    import shutil
    import signal
    for proc, out, err, work in _BACKGROUND.values():
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
            proc.wait()
        out.close()
        err.close()
        shutil.rmtree(work, ignore_errors=True)
