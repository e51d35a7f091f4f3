"""An engine's own output goes where the harness's goes (issue 30, item 4): log.txt always, the
console only with ``-v`` (``utils.run_log``; used by ``--model vllm``, whose logger, worker
warnings and config dump flooded stdout: 1,644 lines for 100 samples)."""
from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest

from reform_eval.evaluation.runinfo import setup_logging
from reform_eval.utils.run_log import library_log_to_run, output_to_log


@pytest.fixture
def clean_root():
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    lib = logging.getLogger("fakeengine")
    yield lib
    for h in list(root.handlers):
        if h not in saved[0]:
            root.removeHandler(h)
            h.close()
    root.setLevel(saved[1])
    lib.handlers.clear()
    lib.propagate = True


def _engine_chatter(lib: logging.Logger) -> None:
    """What an engine does: its own logger, a print, native code writing to fds 1 and 2, a child."""
    lib.warning("cpu worker: a warning")
    lib.info("engine config: {...}")
    print("printed by the engine")
    os.write(1, b"fd 1 from native code\n")
    os.write(2, b"fd 2 from native code\n")
    subprocess.run([sys.executable, "-c", "print('a child process')"], check=True)


@pytest.mark.parametrize("verbose", [False, True])
def test_an_engines_output_goes_to_log_txt_and_to_the_console_only_with_v(tmp_path, capfd, clean_root, verbose):
    lib = clean_root
    lib.addHandler(logging.StreamHandler(sys.stdout))  # as vLLM configures its logger: its own console handler
    lib.propagate = False
    setup_logging(str(tmp_path), is_main=True, verbose=verbose)
    library_log_to_run("fakeengine")
    with output_to_log():
        _engine_chatter(lib)
    print("the harness's own line")
    out, err = capfd.readouterr()
    log = (tmp_path / "log.txt").read_text()
    for line in ("cpu worker: a warning", "engine config", "printed by the engine", "fd 1 from native code",
                 "fd 2 from native code", "a child process"):
        assert line in log or verbose, (line, log)
        assert (line in out + err) == verbose, (line, out, err)
    assert "the harness's own line" in out  # the console is the console again afterwards
