"""A real serving engine: ``transformers serve`` hosts the tiny LLaVA on 127.0.0.1 and
``--model openai_api`` runs iWISDM against it; its predictions must equal the in-process run
with the same chat template, system line and max_new_tokens, character for character.

The server runs from its own virtual environment (``$REFORM_CACHE/serve-venv``), created on
first use in bounded time: it sees this interpreter's packages (torch, transformers) through a
``.pth`` file and adds only what ``transformers[serving]`` lacks here (and Pillow). Where that
cannot be installed (no package index), the test is skipped with one line. The server runs with
one thread, is stopped by its PID, and a watchdog kills it if the test outlives its bound.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from typing import Any, Dict, Tuple

import pytest

from reform_eval.utils.ports import unused_port

pytestmark = pytest.mark.slow

INSTALL_TIMEOUT_S = 600
START_TIMEOUT_S = 180
SERVER_LIFETIME_S = 900


def _serve_python() -> str:
    """The serve venv's python, created and filled on first use; skips the test when it cannot be."""
    import transformers

    from reform_eval.models.tiny import cache_root
    venv = os.path.join(cache_root(), "serve-venv")
    python = os.path.join(venv, "bin", "python")
    ready = os.path.join(venv, f".ready-{transformers.__version__}")
    base = getattr(sys, "_base_executable", None) or sys.executable
    try:
        if not os.path.exists(python):
            subprocess.run([base, "-m", "venv", venv], check=True, capture_output=True, timeout=120)
        site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                              check=True, capture_output=True, text=True, timeout=60).stdout.strip()
        with open(os.path.join(site, "reform_main_env.pth"), "w") as f:  # torch and transformers from here
            f.write(os.path.dirname(os.path.dirname(transformers.__file__)) + "\n")
        if os.path.exists(ready):
            return python
        subprocess.run([python, "-m", "pip", "install", "-q", f"transformers[serving]=={transformers.__version__}",
                        "pillow"], check=True, capture_output=True, timeout=INSTALL_TIMEOUT_S)
        subprocess.run([python, "-c", "import fastapi, uvicorn, openai, PIL, transformers.cli.serve"],
                       check=True, capture_output=True, timeout=120)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as e:
        detail = getattr(e, "stderr", b"") or b""
        detail = detail.decode(errors="replace") if isinstance(detail, bytes) else detail
        pytest.skip(f"transformers[serving] cannot be installed in {venv}: "
                    f"{(detail.strip().splitlines() or [str(e)])[-1]}")
    open(ready, "w").close()
    return python



@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Any:
    """(base_url, model id) of a running ``transformers serve`` hosting the tiny LLaVA."""
    from reform_eval.models.tiny import tiny_model_path
    python = _serve_python()
    model = tiny_model_path("llava")
    port = unused_port()
    log_path = tmp_path_factory.mktemp("serve") / "serve.log"
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([python, "-m", "transformers.cli.transformers", "serve", model, "--host", "127.0.0.1",
                                 "--port", str(port), "--device", "cpu"], stdout=log, stderr=subprocess.STDOUT,
                                env=env, start_new_session=True)

    def stop() -> None:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=20)
    watchdog = threading.Timer(SERVER_LIFETIME_S, stop)
    watchdog.daemon = True
    watchdog.start()
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"transformers serve exited ({proc.returncode}): {log_path.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"transformers serve did not answer /health in {START_TIMEOUT_S} s: "
                            f"{log_path.read_text()[-2000:]}")
            time.sleep(0.5)
        yield f"http://127.0.0.1:{port}/v1", model
    finally:
        watchdog.cancel()
        stop()
    assert proc.poll() is not None


def _predictions(out: str) -> Dict[Tuple[str, int], Dict[str, Any]]:
    from reform_eval.evaluation.reporting.scoring import prediction_files
    files = prediction_files(out)
    assert len(files) == 1, files
    with open(files[0]) as f:
        data = json.load(f)
    records = data if isinstance(data, list) else data["predictions"]
    return {(r["sample_id"], r["dup_index"]): r for r in records}


def _dataset(name: str, tmp_path: Any) -> list:
    """run_eval arguments of a small set of ``name``: iWISDM low (six frames a trial), MME on
    placeholder images (two subtasks), and MMMT-IF chats with two images each, multi-turn with
    the model's own answers as history."""
    if name == "iWISDM":
        return ["--dataset_name", "iWISDM", "--dataset_config", "iwisdm_low", "--dataset_subsample", "4"]
    if name == "MME":
        from reform_eval.build.mme import write_placeholder_release
        from tests.conftest import ROOT
        root = write_placeholder_release(os.path.join(ROOT, "configs", "data", "mme_questions"),
                                         str(tmp_path / "release"), subtasks=["existence", "OCR"])
        return ["--dataset_name", "MME", "--dataset_config", "mme", "--dataset_option", f"root={root}",
                "--dataset_option", "subtasks=[existence,OCR]", "--dataset_subsample", "4"]
    from tests.test_mmmt_if_run import write_mmdu
    cfg = write_mmdu(str(tmp_path / "mmdu"))
    return ["--dataset_name", "MMMT-IF", "--dataset_config", cfg, "--dataset_option", "num_chats=2",
            "--dataset_option", "max_turns=3"]


@pytest.mark.parametrize("benchmark", ["iWISDM", "MME", "MMMT-IF"])
def test_served_tiny_llava_equals_in_process(served, tmp_path, benchmark):
    from reform_eval import run_eval
    url, model = served
    common = [*_dataset(benchmark, tmp_path), "--max_new_tokens", "8", "--no_cache"]
    assert run_eval.main(["--model", "llava", "--model_name", "tiny", "--model_option", "preprocessor=chat_template",
                          "--output_dir", str(tmp_path / "local"), *common]) == 0
    assert run_eval.main(["--model", "openai_api", "--model_name", model, "--model_option", f"base_url={url}",
                          "--model_option", "timeout=120",
                          "--model_option", "max_concurrency=1", "--output_dir", str(tmp_path / "api"),
                          *common]) == 0
    local, api = _predictions(str(tmp_path / "local")), _predictions(str(tmp_path / "api"))
    assert sorted(local) == sorted(api) and len(local) == {"iWISDM": 4, "MME": 8, "MMMT-IF": 6}[benchmark]  # MME: whole image pairs
    for key in local:
        assert api[key]["prediction"] == local[key]["prediction"], key
        assert api[key]["image_ids"] == local[key]["image_ids"]
        usage = api[key]["usage"]
        assert usage["completion_tokens"] == api[key]["generated_tokens"] <= 8 and usage["prompt_tokens"] > 0
    if benchmark == "MMMT-IF":  # later turns carry the model's own earlier answers, on both paths
        for key, r in api.items():
            mine = [t["value"] for t in r["history"] if t["from"] == "assistant"]
            assert mine == [t["value"] for t in local[key]["history"] if t["from"] == "assistant"]
            assert len(mine) == r["meta"]["turn"] - 1
        assert any(len(r["image_ids"]) == 2 for r in api.values())
