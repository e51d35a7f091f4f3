"""vLLM as a real engine: ``--model vllm`` (the offline ``vllm.LLM``) and ``--model openai_api`` against
a vLLM server give the in-process answers of the known-skill LLaVA (``--model llava --model_name
tiny-trained``), for generation and for likelihood.

* generation: predictions equal, character for character, on iWISDM identification (both presets),
  the synthetic MME set and MMMT-IF multi-image chats (later turns carry the model's own answers);
* likelihood: every candidate's summed log-probability within 1e-4 of the in-process score, the
  same token counts, and the same choice on every sample.

The engine runs from its own venv (``commands/vllm_env.sh``, built once per machine and cached);
where it cannot be built the tests skip with that script's one line. Time: one server and one
offline engine start for the whole module (``tests/vllm_runs.py`` runs every offline command line
in one process); the server starts in the background while the offline runs go. The server
listens on 127.0.0.1, has a bounded lifetime (a watchdog) and is stopped by its PID.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
import urllib.request
from typing import Any, Dict, List, Tuple

import pytest

from reform_eval.utils.ports import unused_port

from tests.conftest import ROOT, prediction_files
from tests.conftest import vllm_python as built_vllm_python

pytestmark = [pytest.mark.engine, pytest.mark.slow]

START_TIMEOUT_S = 900   # a vLLM server's start-up on a loaded 2-core machine (about a minute when idle)
RUNS_TIMEOUT_S = 1500   # every offline run, engine start included
SERVER_LIFETIME_S = 2400
MAX_NEW = 8
#: what "equal" means for likelihood scores (float32 on both sides, different kernels)
SCORE_TOL = 1e-4
#: the equality counts of this module, printed at its end (the report quotes them)
COUNTS: List[str] = []


def _vllm_python() -> str:
    return built_vllm_python()  # the venv, or a one-line skip (tests/conftest.py)


def _engine_env() -> Dict[str, str]:
    return dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_CPU_KVCACHE_SPACE="1",
                VLLM_CPU_OMP_THREADS_BIND="nobind", TORCHDYNAMO_DISABLE="1", TOKENIZERS_PARALLELISM="false",
                PYTHONPATH=ROOT)



# -- the data: the same argument lists for every engine --------------------------------------------
def _datasets(tmp: str) -> Dict[str, List[str]]:
    from reform_eval.build.mme_synthetic import write_yesno_release
    from tests.test_mmmt_if_run import write_mmdu
    mme = write_yesno_release(os.path.join(tmp, "yesno"), n_images=4, seed=3)
    mmdu = write_mmdu(os.path.join(tmp, "mmdu"))
    return {
        "identify_category": ["--dataset_name", "iWISDM", "--dataset_config", "iwisdm_identify_category",
                              "--dataset_option", "n_trials=8"],
        "identify_location": ["--dataset_name", "iWISDM", "--dataset_config", "iwisdm_identify_location",
                              "--dataset_option", "n_trials=8"],
        "mme_synthetic": ["--dataset_name", "MME", "--dataset_config", "mme_synthetic", "--formulation", "Generation",
                          "--dataset_option", f"root={mme}"],
        "mmmt_if": ["--dataset_name", "MMMT-IF", "--dataset_config", mmdu, "--dataset_option", "num_chats=2",
                    "--dataset_option", "max_turns=3"],
    }


GENERATION = ("identify_category", "identify_location", "mme_synthetic", "mmmt_if")
LIKELIHOOD = ("identify_category", "identify_location")


def _runs(model: List[str], data: Dict[str, List[str]], out: str) -> Dict[Tuple[str, str], List[str]]:
    """(method, dataset) -> run_eval arguments for ``model``."""
    runs = {}
    for name in GENERATION:
        runs[("generation", name)] = [*model, *data[name], "--max_new_tokens", str(MAX_NEW), "--no_cache",
                                      "--per_gpu_eval_batch_size", "8", "--output_dir", os.path.join(out, "gen", name)]
    for name in LIKELIHOOD:
        runs[("likelihood", name)] = [*model, *data[name], "--infer_method", "likelihood", "--no_cache",
                                      "--per_gpu_eval_batch_size", "8", "--output_dir", os.path.join(out, "lik", name)]
    return runs


def _records(out_dir: str) -> Dict[Tuple[str, int], Dict[str, Any]]:
    (pred,) = prediction_files(out_dir)
    with open(pred, encoding="utf-8") as f:
        return {(r["sample_id"], r["dup_index"]): r for r in json.load(f)}


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Dict[str, List[str]]:
    return _datasets(str(tmp_path_factory.mktemp("data")))


@pytest.fixture(scope="module")
def in_process(data, tmp_path_factory) -> Dict[Tuple[str, str], str]:
    """The in-process HF runs (this interpreter): (method, dataset) -> output folder."""
    from reform_eval import run_eval
    out = str(tmp_path_factory.mktemp("hf"))
    runs = _runs(["--model", "llava", "--model_name", "tiny-trained"], data, out)
    for argv in runs.values():
        assert run_eval.main(argv) == 0, argv
    return {k: v[-1] for k, v in runs.items()}


@pytest.fixture(scope="module")
def vllm_python() -> str:
    return _vllm_python()


@pytest.fixture(scope="module")
def server_process(vllm_python, tmp_path_factory):
    """A vLLM OpenAI-compatible server for tiny-trained, started at once (it loads while other
    tests run); yields (process, port, log path); stopped by its PID, with a watchdog."""
    env = _engine_env()
    engine_path = subprocess.run([vllm_python, "-m", "reform_eval.models.vllm_checkpoint", "tiny-trained"], cwd=ROOT, env=env,
                                 capture_output=True, text=True, timeout=300, check=True).stdout.strip().splitlines()[-1]
    port = unused_port()
    log_path = tmp_path_factory.mktemp("vllm_server") / "server.log"
    cmd = [vllm_python, "-m", "vllm.entrypoints.openai.api_server", "--model", engine_path,
           "--served-model-name", "tiny-trained", "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
           "--enforce-eager", "--seed", "0", "--limit-mm-per-prompt", json.dumps({"image": 8}),
           "--mm-processor-kwargs", json.dumps({"backend": "pil"})]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def stop() -> None:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)  # its own session: the server and the engine process it started
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
    watchdog = threading.Timer(SERVER_LIFETIME_S, stop)
    watchdog.daemon = True
    watchdog.start()
    try:
        yield proc, port, log_path
    finally:
        watchdog.cancel()
        stop()
    assert proc.poll() is not None


@pytest.fixture(scope="module")
def served(server_process) -> str:
    """The server's /v1 URL once it answers /health."""
    proc, port, log_path = server_process
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        if proc.poll() is not None:
            pytest.fail(f"the vLLM server exited ({proc.returncode}): {log_path.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                if r.status == 200:
                    return f"http://127.0.0.1:{port}/v1"
        except OSError:
            pass
        if time.monotonic() > deadline:
            pytest.fail(f"the vLLM server did not answer /health in {START_TIMEOUT_S} s: {log_path.read_text()[-3000:]}")
        time.sleep(1.0)


# -- comparisons -------------------------------------------------------------------------------------
def _compare(engine: str, runs: Dict[Tuple[str, str], str], in_process: Dict[Tuple[str, str], str]) -> None:
    """Every run of ``engine`` against its in-process run; counts go to COUNTS; all must agree."""
    failures = []
    for (method, name), out in sorted(runs.items()):
        mine, ref = _records(out), _records(in_process[(method, name)])
        assert sorted(mine) == sorted(ref), (engine, method, name)
        if method == "generation":
            same = sum(mine[k]["prediction"] == ref[k]["prediction"] for k in ref)
            COUNTS.append(f"{engine} generation {name}: {same}/{len(ref)} predictions equal")
            failures += [(engine, name, k, mine[k]["prediction"], ref[k]["prediction"]) for k in ref
                         if mine[k]["prediction"] != ref[k]["prediction"]]
            if name == "mmmt_if":  # multi-image chats, later turns carrying the model's own answers
                assert any(len(r["image_ids"]) == 2 for r in mine.values())
                for k, r in mine.items():
                    assert [t["value"] for t in r["history"]] == [t["value"] for t in ref[k]["history"]], k
        else:
            worst = max(abs(a - b) for k in ref
                        for a, b in zip(mine[k]["candidate_logprobs"], ref[k]["candidate_logprobs"]))
            same = sum(mine[k]["prediction"] == ref[k]["prediction"] for k in ref)
            n_cands = sum(len(r["candidates"]) for r in ref.values())
            COUNTS.append(f"{engine} likelihood {name}: {same}/{len(ref)} choices equal, {n_cands} candidate "
                          f"scores, max |diff| {worst:.2e}")
            for k in ref:
                assert mine[k]["candidate_num_tokens"] == ref[k]["candidate_num_tokens"], (engine, name, k)
                assert len(mine[k]["candidate_logprobs"]) == len(ref[k]["candidate_logprobs"])
            if worst > SCORE_TOL or same != len(ref):
                failures.append((engine, name, f"max |diff| {worst:.2e}", f"{same}/{len(ref)} choices"))
    print("\n".join(COUNTS[-len(runs):]), flush=True)
    assert not failures, failures[:5]


def test_offline_engine_equals_in_process(vllm_python, server_process, in_process, data, tmp_path):
    """``$VLLM_PY run_eval.py --model vllm --model_name tiny-trained``: every run in one process
    (tests/vllm_runs.py), the engine started once."""
    runs = _runs(["--model", "vllm", "--model_name", "tiny-trained"], data, str(tmp_path))
    spec = tmp_path / "runs.json"
    spec.write_text(json.dumps({"runs": list(runs.values())}))
    proc = subprocess.run([vllm_python, os.path.join(ROOT, "tests", "vllm_runs.py"), str(spec)], cwd=ROOT,
                          env=_engine_env(), capture_output=True, text=True, timeout=RUNS_TIMEOUT_S)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    # quiet by default (issue 30): the engine's log, worker warnings and config dump are in each run's
    # log.txt, the console holds the harness's own lines only
    noise = [ln for ln in proc.stdout.splitlines() if ln.strip() and not ln.startswith(("{", "predictions:", "to score"))]
    assert not noise, noise[:5]
    assert not [ln for ln in proc.stderr.splitlines() if "vllm" in ln.lower()], proc.stderr[-2000:]
    _compare("vllm offline", {k: v[-1] for k, v in runs.items()}, in_process)
    # what the engine says it was (the run's provenance record) and what it was handed (traces)
    (engine,) = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith('{"provenance"')]
    prov = engine["provenance"]
    assert prov["engine"] == "vllm" and prov["family"] == "llava" and prov["dtype"] == "float32"
    assert prov["versions"]["vllm"] and prov["versions"]["torch"] and prov["versions"]["transformers"]
    assert prov["bos_token"] == "<s>" and prov["adds_bos"] is True and prov["preprocessor"] == "ChatTemplateProcessor"
    assert prov["image_processor"]["backend"] == "pil" and prov["image_processor"]["class"].endswith("Pil")
    assert prov["model_class"] == "LlavaForConditionalGeneration" and len(prov["chat_template_sha"]) == 16
    assert engine["traces"] and all(engine["traces"]), "the last run recorded no traces"
    for t in engine["traces"]:  # the last run: likelihood on identify_location (one frame a trial)
        assert len(t["prompt_sha"]) == 16 and t["bos"] is True and t["prompt_tokens"] > 16
        # the engine's pixel tensors are not exposed: unknown, never re-computed; the images' content
        # is the run's own hash (docs/provenance.md)
        assert t["pixel_sha"] is None and len(t["image_sha"]) == 16
    _explains_like_in_process({k: v[-1] for k, v in runs.items()}, in_process)


#: run-level facts only the vLLM engine has (the in-process run has no engine arguments to record)
ENGINE_ONLY = ("provenance.engine_args", "provenance.engine_env", "provenance.family", "provenance.checkpoint",
               "provenance.engine_checkpoint", "provenance.versions.vllm", "versions.vllm")
#: and what only the in-process run knows (vLLM picks its attention backend inside the engine)
IN_PROCESS_ONLY = ("provenance.attn_implementation",)


def _explains_like_in_process(runs: Dict[Tuple[str, str], str], in_process: Dict[Tuple[str, str], str]) -> None:
    """One shape for each provenance field whatever the engine (issue 34): explain between the
    in-process run and the vLLM run of the same checkpoint lists no field as recorded by one run
    only unless only the engine can know it; the image processor's settings compare (its output
    size was a repr string under vLLM, a mapping in process), and the same pictures are not
    taken for other pixels."""
    from reform_eval.evaluation.reporting.explain_files import explain_files
    for key in (("generation", "identify_category"), ("likelihood", "identify_location")):
        exp = explain_files(in_process[key], runs[key], quiet=True)
        for entry in exp["recorded_by_one_run"]:
            known_by = ENGINE_ONLY if entry["recorded_by"] == "B" else IN_PROCESS_ONLY
            assert all(k.startswith(known_by) for k in entry["keys"]), entry
        factors = {d["factor"] for d in exp["differences"]}
        assert not factors & {"image size", "image processor", "image processor backend", "image resampling",
                              "BOS", "chat template", "system line", "prompt format"}, exp["differences"]
        assert all(f["pixels_differ"] is False and f["prompt_differs"] is False for f in exp["flips"]), exp["flips"]


def test_served_engine_equals_in_process(served, in_process, data, tmp_path):
    """``--model openai_api`` against the vLLM server: generation with BOS asked for
    (``extra_body={add_special_tokens: true}``, as the in-process processor adds it), likelihood
    through prompt log-probabilities (BOS by default)."""
    from reform_eval import run_eval
    model = ["--model", "openai_api", "--model_name", "tiny-trained", "--model_option", f"base_url={served}",
             "--model_option", "timeout=300", "--model_option", "max_concurrency=8"]
    runs = _runs(model, data, str(tmp_path))
    for (method, _), argv in runs.items():
        extra = ["--model_option", "extra_body={add_special_tokens: true}"] if method == "generation" else []
        assert run_eval.main([*argv, *extra]) == 0, argv
    _compare("vllm served", {k: v[-1] for k, v in runs.items()}, in_process)


def test_served_generation_without_bos_is_what_the_server_tokenized(served, tmp_path):
    """Without ``add_special_tokens`` the chat endpoint drops BOS (vLLM's default): the prompt is
    one token shorter than with it; the harness leaves generation requests as configured and
    likelihood asks for BOS itself (models.openai_likelihood)."""
    body = {"model": "tiny-trained", "messages": [{"role": "user", "content": "Is it red?"}], "max_tokens": 1,
            "temperature": 0}
    counts = []
    for extra in ({}, {"add_special_tokens": True}):
        req = urllib.request.Request(f"{served}/chat/completions", data=json.dumps({**body, **extra}).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            counts.append(json.loads(r.read())["usage"]["prompt_tokens"])
    assert counts[1] == counts[0] + 1, counts


def test_zz_equality_counts():
    """The counts of this module, in one place (the report quotes them)."""
    print("\n" + "\n".join(COUNTS), flush=True)
    assert COUNTS
