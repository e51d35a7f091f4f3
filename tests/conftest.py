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
# the engines' venvs (commands/vllm_env.sh, lmms_eval_env.sh: gigabytes, built once per machine) stay
# under the machine's cache root while the tests' own cache goes into the clone
os.environ.setdefault("REFORM_VENVS", os.path.join(os.path.expanduser(
    os.environ.get("REFORM_CACHE") or os.path.join("~", ".cache", "reform_eval")), "venvs"))
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
    from reform_eval.evaluation.reporting.scoring import prediction_files as found
    return found(str(out))


def results_of(pred: str, tag: str = "") -> dict:
    """The results run_eval wrote for a prediction file (``<stem>.results.json``, or its one
    ``<stem>.eval-<hash>.results.json`` when scored with other options), or those with ``tag``."""
    from reform_eval.evaluation.reporting.scoring import results_files, results_paths
    paths = results_paths(str(pred), tag=tag or None)
    path = paths["json"]
    if not tag and not os.path.exists(path):
        found = [p for p in results_files(str(pred)) if os.path.basename(p).startswith(paths["stem"] + ".eval-")]
        assert len(found) == 1, found
        path = found[0]
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def vllm_python() -> str:
    """The python of the vLLM engine's venv (``commands/vllm_env.sh`` builds it once per machine; a
    ready one answers at once), or the calling test skips with that script's one line (``engine``
    tests: they need a real engine and nothing else stands in for it)."""
    import subprocess
    timeout = int(os.environ.get("REFORM_VLLM_BUILD_TIMEOUT", "2400"))
    try:
        proc = subprocess.run(["bash", os.path.join(ROOT, "commands", "vllm_env.sh")], capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.skip(f"the vLLM venv was not built within {timeout} s (commands/vllm_env.sh)")
    if proc.returncode != 0:
        pytest.skip((proc.stderr.strip().splitlines() or ["commands/vllm_env.sh failed"])[-1])
    return proc.stdout.strip().splitlines()[-1]


def only_results(directory) -> dict:
    """The one results file in ``directory`` (``*.results.json``, else a run without --do_eval's
    ``*.run.json``); fails when there is none or more than one."""
    names = sorted(os.listdir(directory))
    found = [n for n in names if n.endswith(".results.json")] or [n for n in names if n.endswith(".run.json")]
    assert len(found) == 1, names
    with open(os.path.join(str(directory), found[0]), encoding="utf-8") as f:
        return json.load(f)


# ---------------------------------------------------------------------------------------------
# The parallel layout (pytest-xdist). `bash commands/test.sh` runs the suite on every core with
# `-n auto --dist loadgroup --no-loadscope-reorder`; a plain `python -m pytest tests/...` runs in
# one process, in the same order. The rules, for every test (a new one included):
#
# * Work unit = a test module, by default: its tests run on one worker, in order, so its
#   module-scoped fixtures are built once (under load distribution a worker switching modules
#   would tear them down and build them again).
# * `@pytest.mark.spread`: the test may run on any worker, alone (a parametrised matrix whose
#   cells are independent and heavy). Module fixtures it uses are then built once per worker.
# * `@pytest.mark.xdist_group("name")`: tests that share something outside their own tmp_path
#   (a file in the repository, a fixed port, a named lock) run on one worker, one after another,
#   whatever their modules; a test marked both `spread` and `xdist_group` follows the group.
# * Heaviest units first (each `slow` test counts as 30 quick ones), so no long unit starts last;
#   tests that wait for a background job come last.
# * What a test writes goes under its tmp_path (each worker has its own basetemp); ports come from
#   the OS (port 0, torchrun --standalone) or `utils.ports.unused_port` for a server another
#   process binds (below the kernel's ephemeral range: a probe's bind(0) number could be taken by
#   a concurrent run's sockets before the server binds it), never a fixed number. REFORM_CACHE is
#   shared by the workers: tiny models are built under a lock (models/tiny.py), so one worker
#   builds while the other waits; a test that builds on purpose uses the `cache_dir` fixture.
# * OMP_NUM_THREADS=1 unless set: two workers on two cores, each with one intra-op thread (more
#   threads per worker only spin against each other).
# * Background jobs (`background` marker): started once per session by whichever process gets
#   there first, waited for by the test wherever it runs (tests/background_jobs.py). Under xdist
#   a job runs at normal priority, as one more worker (every core is busy: at the lowest it would
#   only start when the workers are done, and then run alone); in one process at the lowest, on
#   the core the suite leaves idle.
# ---------------------------------------------------------------------------------------------
os.environ.setdefault("OMP_NUM_THREADS", "1")

#: cost of a `slow` test against a quick one when ordering the work units
SLOW_WEIGHT = 30


def pytest_addoption(parser) -> None:
    parser.addoption("--durations-cpu", type=int, default=None, metavar="N",
                     help="show the N tests that used the most CPU time (their process and the subprocesses "
                          "it waited for): on a shared machine wall-clock durations also count other jobs")


def _is_worker(config) -> bool:
    return hasattr(config, "workerinput")


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "slow: takes over ~20 s; `bash commands/test.sh -m 'not slow'` is the quick subset")
    config.addinivalue_line("markers", "engine: runs a real external engine (vLLM, lmms-eval) from its own venv "
                            "(commands/vllm_env.sh, commands/lmms_eval_env.sh); skipped with one line where that "
                            "venv cannot be built")
    config.addinivalue_line("markers", "background(cmd): the test's command starts in a background process as soon "
                            "as collection ends and runs beside the rest of the suite (see background_result)")
    config.addinivalue_line("markers", "spread: the test runs on any xdist worker, alone (see the parallel layout "
                            "in tests/conftest.py); by default a module's tests run together")
    config.addinivalue_line("markers", "xdist_group(name): tests sharing a resource run on one worker, in order")
    if not _is_worker(config) and "REFORM_TEST_JOBS" not in os.environ:
        # the session's owner: the folder of its background jobs, inherited by the xdist workers
        import tempfile
        os.environ["REFORM_TEST_JOBS"] = tempfile.mkdtemp(prefix="reform-test-jobs-")
        os.environ["REFORM_TEST_OWNER"] = str(os.getpid())
        config._reform_jobs_owner = True


def _skipped(item) -> bool:
    """Whether a ``skipif`` marker of the item holds (its test would skip: no job to start); a
    condition object is asked here, as pytest asks it (``bool``), only for the tests that run."""
    return any(m.args and not isinstance(m.args[0], str) and bool(m.args[0]) for m in item.iter_markers("skipif"))


def _unit(item) -> str:
    """The work unit of a test (see the parallel layout above)."""
    group = item.get_closest_marker("xdist_group")
    if group is not None:
        return "group:" + str(group.args[0] if group.args else group.kwargs.get("name", "default"))
    if item.get_closest_marker("spread") is not None or item.get_closest_marker("background") is not None:
        return "test:" + item.nodeid
    return "module:" + item.nodeid.split("::", 1)[0]


def pytest_collection_modifyitems(session, config, items) -> None:
    """Order the work units heaviest first, background waits last, and (in an xdist worker) tell
    the controller's scheduler each test's unit (``units.json`` in the session's folder)."""
    units: dict = {}
    for item in items:
        units.setdefault(_unit(item), []).append(item)

    def cost(unit_items) -> int:
        return sum(SLOW_WEIGHT if i.get_closest_marker("slow") else 1 for i in unit_items)

    order = sorted(units.values(), key=lambda u: (any(i.get_closest_marker("background") for i in u), -cost(u)))
    items[:] = [item for unit in order for item in unit]
    root = os.environ.get("REFORM_TEST_JOBS")
    if _is_worker(config) and root:
        import json
        path = os.path.join(root, "units.json")
        with open(f"{path}.{os.getpid()}", "w", encoding="utf-8") as f:
            json.dump({item.nodeid: unit for unit, its in units.items() for item in its}, f)
        os.replace(f"{path}.{os.getpid()}", path)


def pytest_xdist_make_scheduler(config, log):
    """``--dist loadgroup``: one work unit per test module, ``spread`` test or ``xdist_group``
    (the layout above), in the collection's order (heaviest first). xdist's own loadgroup marks
    a test by editing ``item._nodeid``, which pytest 9 no longer reads, so the units come from
    the workers' ``units.json`` instead."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class UnitScheduling(LoadScopeScheduling):
        def __init__(self, config, log=None) -> None:
            super().__init__(config, log)
            config.option.loadscopereorder = False  # keep the heaviest-first order of the collection
            self._units = None

        def _split_scope(self, nodeid: str) -> str:
            if self._units is None:
                import json
                with open(os.path.join(os.environ["REFORM_TEST_JOBS"], "units.json"), encoding="utf-8") as f:
                    self._units = json.load(f)
            return self._units.get(nodeid, nodeid)

    return UnitScheduling(config, log)


def pytest_collection_finish(session) -> None:
    """Start the ``background`` command of each test that will run (after -k/-m deselection and
    skipif), so a long, independent job (the known-skill model's retraining) runs on the CPU the
    suite leaves idle instead of adding to its time (tests/background_jobs.py)."""
    from tests import background_jobs
    root, owner = os.environ.get("REFORM_TEST_JOBS"), os.environ.get("REFORM_TEST_OWNER")
    if not root or not owner:
        return
    for item in session.items:
        marker = item.get_closest_marker("background")
        if marker is not None and not _skipped(item):
            background_jobs.start(root, marker.args, int(owner), nice=0 if _is_worker(session.config) else 19)


def background_result(request, timeout: float = 1800.0):
    """(return code, stdout, stderr, work folder) of the test's background command, waiting for it."""
    from tests import background_jobs
    return background_jobs.wait(os.environ["REFORM_TEST_JOBS"], request.node.get_closest_marker("background").args,
                                timeout)


def pytest_sessionfinish(session, exitstatus) -> None:
    """The session's owner kills any background job still running (its test deselected late,
    failed early or interrupted) and removes the jobs' folder."""
    if getattr(session.config, "_reform_jobs_owner", False):
        import shutil

        from tests import background_jobs
        root = os.environ.get("REFORM_TEST_JOBS", "")
        background_jobs.stop_all(root)
        shutil.rmtree(root, ignore_errors=True)


# -- CPU time per test ---------------------------------------------------------------------------
def _cpu_seconds() -> float:
    import resource
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item) -> None:
    item._reform_cpu_start = _cpu_seconds()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if call.when == "teardown" and hasattr(item, "_reform_cpu_start"):
        report.user_properties.append(("cpu_s", round(_cpu_seconds() - item._reform_cpu_start, 2)))


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    """``--durations-cpu N``: the N tests that used the most CPU (setup, call and teardown, with
    the subprocesses they waited for), and the total over all tests."""
    n = config.getoption("--durations-cpu")
    if n is None or _is_worker(config):
        return
    cpu = {}
    for reports in terminalreporter.stats.values():
        for rep in reports:
            for key, value in getattr(rep, "user_properties", ()) or ():
                if key == "cpu_s" and getattr(rep, "when", None) == "teardown":
                    cpu[rep.nodeid] = value
    terminalreporter.write_sep("=", f"{min(n, len(cpu)) if n else len(cpu)} most CPU-hungry tests "
                                    f"(total {sum(cpu.values()):.0f} CPU-s over {len(cpu)} tests)")
    for nodeid, value in sorted(cpu.items(), key=lambda kv: -kv[1])[:n or None]:
        terminalreporter.write_line(f"{value:8.2f}s cpu  {nodeid}")
