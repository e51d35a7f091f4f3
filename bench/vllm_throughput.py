"""Throughput of the known-skill LLaVA (``tiny-trained``) in process (transformers) and through vLLM
(the offline engine, ``--model vllm``, and a vLLM server, ``--model openai_api``), at concurrency 1
and 8, measured side by side in one run.

What is timed: ``run_eval``'s inference phase (the run's ``timing.forward_s``: every forward call,
the model's work and the harness's per-batch work, engine start-up excluded and reported apart as
``*_start_s``) on the same iWISDM identification trials (both presets), greedy generation of up to
8 tokens. Concurrency: ``--per_gpu_eval_batch_size`` in process and offline (one ``generate`` /
one engine call per batch); for the server ``max_concurrency`` requests in flight, batches of 8.
The engines run from the vLLM venv (``commands/vllm_env.sh``); the offline runs share one engine
(``tests/vllm_runs.py``), the server is started once, on 127.0.0.1, and stopped by its PID.

Usage: python bench/vllm_throughput.py [--trials 16] [--smoke]
(``--smoke``: 2 trials per preset, every engine still started once: about 4 minutes here.)

Prints: samples=... hf_c1_sps=... hf_c8_sps=... vllm_c1_sps=... vllm_c8_sps=... served_c1_sps=...
served_c8_sps=... vllm_vs_hf_c8=... served_vs_hf_c8=... vllm_start_s=... served_start_s=...
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from typing import Dict, List

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from reform_eval.utils.ports import unused_port  # noqa: E402

START_TIMEOUT_S = 900
SERVER_LIFETIME_S = 3600


def _engine_env() -> Dict[str, str]:
    return dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_CPU_KVCACHE_SPACE="1",
                VLLM_CPU_OMP_THREADS_BIND="nobind", TORCHDYNAMO_DISABLE="1", TOKENIZERS_PARALLELISM="false",
                PYTHONPATH=ROOT)


def _data(trials: int) -> List[str]:
    return ["--dataset_name", "iWISDM", "--dataset_config", "iwisdm_identify_category", "--dataset_option",
            "preset=[identify_category,identify_location]", "--dataset_option", f"n_trials={trials}",
            "--max_new_tokens", "8", "--no_cache"]


def _timing(out: str) -> Dict[str, float]:
    from reform_eval.evaluation.reporting.scoring import prediction_files, results_paths
    (pred,) = prediction_files(out)
    with open(results_paths(pred)["run"], encoding="utf-8") as f:
        return json.load(f)["timing"]


def _records(out: str) -> int:
    from reform_eval.evaluation.reporting.scoring import prediction_files
    (pred,) = prediction_files(out)
    with open(pred, encoding="utf-8") as f:
        return len(json.load(f))



def main(argv: List[str] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=16, help="iWISDM trials per identification preset (default: 16)")
    ap.add_argument("--smoke", action="store_true", help="2 trials per preset (engines still start once)")
    args = ap.parse_args(argv)
    trials = 2 if args.smoke else args.trials
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("REFORM_NO_CACHE", "1")
    from reform_eval import run_eval

    work = tempfile.mkdtemp(prefix="vllm-bench-")
    data = _data(trials)
    sps: Dict[str, float] = {}
    n = 0

    # in process (this interpreter)
    for c in (1, 8):
        out = os.path.join(work, f"hf{c}")
        assert run_eval.main(["--model", "llava", "--model_name", "tiny-trained", *data,
                              "--per_gpu_eval_batch_size", str(c), "--output_dir", out]) == 0
        n = _records(out)
        sps[f"hf_c{c}"] = n / _timing(out)["forward_s"]
        print(f"in-process c={c}: {n} samples in {_timing(out)['forward_s']:.2f} s", flush=True)

    build = subprocess.run(["bash", os.path.join(ROOT, "commands", "vllm_env.sh")], capture_output=True, text=True)
    if build.returncode != 0:
        print(f"vLLM venv unavailable: {build.stderr.strip()}", file=sys.stderr)
        return 1
    vpy = build.stdout.strip().splitlines()[-1]

    # offline engine: both runs in one process, one engine start
    spec = os.path.join(work, "runs.json")
    outs = {c: os.path.join(work, f"vllm{c}") for c in (1, 8)}
    with open(spec, "w", encoding="utf-8") as f:
        json.dump({"runs": [["--model", "vllm", "--model_name", "tiny-trained", *data, "--per_gpu_eval_batch_size",
                             str(c), "--output_dir", outs[c]] for c in (1, 8)]}, f)
    proc = subprocess.run([vpy, os.path.join(ROOT, "tests", "vllm_runs.py"), spec], cwd=ROOT, env=_engine_env(),
                          capture_output=True, text=True)
    if proc.returncode != 0:
        print(proc.stdout[-2000:] + proc.stderr[-3000:], file=sys.stderr)
        return 1
    vllm_start = _timing(outs[1])["model_load_s"]
    for c in (1, 8):
        sps[f"vllm_c{c}"] = _records(outs[c]) / _timing(outs[c])["forward_s"]
        print(f"vLLM offline c={c}: {_records(outs[c])} samples in {_timing(outs[c])['forward_s']:.2f} s", flush=True)

    # a vLLM server
    engine_path = subprocess.run([vpy, "-m", "reform_eval.models.vllm_checkpoint", "tiny-trained"], cwd=ROOT, env=_engine_env(),
                                 capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
    port = unused_port()
    log = open(os.path.join(work, "server.log"), "wb")
    t0 = time.perf_counter()
    server = subprocess.Popen([vpy, "-m", "vllm.entrypoints.openai.api_server", "--model", engine_path,
                               "--served-model-name", "tiny-trained", "--host", "127.0.0.1", "--port", str(port),
                               "--dtype", "float32", "--enforce-eager", "--seed", "0",
                               "--mm-processor-kwargs", json.dumps({"backend": "pil"})],
                              cwd=ROOT, env=_engine_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        while True:
            if server.poll() is not None:
                raise SystemExit(f"vLLM server exited; see {log.name}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.perf_counter() - t0 > START_TIMEOUT_S:
                raise SystemExit(f"vLLM server not up in {START_TIMEOUT_S} s; see {log.name}")
            time.sleep(1.0)
        served_start = time.perf_counter() - t0
        for c in (1, 8):
            out = os.path.join(work, f"served{c}")
            assert run_eval.main(["--model", "openai_api", "--model_name", "tiny-trained", "--model_option",
                                  f"base_url=http://127.0.0.1:{port}/v1", "--model_option", f"max_concurrency={c}",
                                  "--model_option", "extra_body={add_special_tokens: true}", *data,
                                  "--per_gpu_eval_batch_size", "8", "--output_dir", out]) == 0
            sps[f"served_c{c}"] = _records(out) / _timing(out)["forward_s"]
            print(f"vLLM served c={c}: {_records(out)} samples in {_timing(out)['forward_s']:.2f} s", flush=True)
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)  # its own session: the server and its engine process
            try:
                server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait()
        log.close()

    print("| engine | concurrency 1 (samples/s) | concurrency 8 (samples/s) |")
    print("|---|---|---|")
    for key, label in (("hf", "in-process transformers"), ("vllm", "vLLM offline (`--model vllm`)"),
                       ("served", "vLLM server (`--model openai_api`)")):
        print(f"| {label} | {sps[key + '_c1']:.1f} | {sps[key + '_c8']:.1f} |")
    pairs = {"samples": n, **{f"{k}_sps": f"{v:.2f}" for k, v in sps.items()},
             "vllm_vs_hf_c8": f"{sps['vllm_c8'] / sps['hf_c8']:.2f}",
             "served_vs_hf_c8": f"{sps['served_c8'] / sps['hf_c8']:.2f}",
             "vllm_start_s": f"{vllm_start:.1f}", "served_start_s": f"{served_start:.1f}"}
    print(" ".join(f"{k}={v}" for k, v in pairs.items()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
