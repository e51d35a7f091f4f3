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

The harness against the bare engine (issue 35), in the same engine process: ``--bare_trials``
iWISDM identify_category trials (default 128), greedy, 8 new tokens, ``--no_cache``, at batch 8
and 128, ``--reps`` repetitions (default 3) after one warm-up run. The harness: ``--model vllm``'s
``timing.forward_s``. The bare engine: the very ``vllm.LLM`` the harness started (so the engine
arguments and environment its provenance records), handed the requests the harness handed it
(the same token ids, images and sampling parameters, captured at ``VLLMInterface._generate``),
timed around ``llm.generate``; its generated tokens must equal the harness's on every request.
Rates are the best over the repetitions (the least disturbed by other work on the machine);
``vllm_vs_bare`` is harness rate / bare rate at batch 128, and ``vllm_vs_bare_cpu`` the same
ratio in CPU time of this process (bare CPU seconds / those of the interface's ``forward``), the median over
the repetitions: on a shared machine wall time moves with the neighbours' load, CPU time much
less, and with the engine's spinning threads too. Steadier, as each repetition times its parts
side by side: ``harness_own_b128_s``, the median over the batch-128 repetitions of the harness's
own part of ``forward_s`` (``forward_s`` less the engine call inside it, timed as the bare
engine's ``llm.generate`` is: rendering, tokenizing, the requests, decoding, traces, checks), and
``engine_call_vs_bare``, the median ratio of that engine call to the bare engine's on the same
requests (1 within the noise: the same work; which side goes first alternates between
repetitions), with ``engine_call_vs_bare_range``, its lowest and highest repetition (``n/a`` with
one): the same requests through the same engine differ by that much from call to call, so a
``vllm_vs_bare`` nearer the target than that spread is not decided by the run (on this machine
identical calls have differed by 2x). The harness's rate is the bare rate divided by
``engine_call_vs_bare`` and by 1 + own time / engine call; ``own_vs_engine_b128`` is that own
time over the bare engine's median call, the part the harness decides: at equal engine calls
the ratio is 1 / (1 + it). Then one more batch-128 run with a timer around each step of the batch
loop (render, images, tokenize, the engine call, decode, trace; the rest of ``forward_s`` as
``other``), printed as ``steps:``.

Usage: python bench/vllm_throughput.py [--trials 16] [--bare_trials 128] [--reps 3]
       [--engines hf,vllm,served] [--smoke]
(``--smoke``: 2 trials per preset and 16 bare trials, one repetition, every engine still started
once: about 4 minutes here.)

Prints: samples=... hf_c1_sps=... hf_c8_sps=... vllm_c1_sps=... vllm_c8_sps=... served_c1_sps=...
served_c8_sps=... vllm_vs_hf_c8=... served_vs_hf_c8=... vllm_start_s=... served_start_s=...
bare_samples=... harness_b8_sps=... bare_b8_sps=... harness_b128_sps=... bare_b128_sps=...
vllm_vs_bare=... vllm_vs_bare_cpu=... harness_own_b128_s=... engine_call_vs_bare=...
engine_call_vs_bare_range=LO-HI own_vs_engine_b128=... identical=... (keys of engines left out by
``--engines`` are not printed)
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
from typing import Any, Dict, List

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



def _bare_data(trials: int) -> List[str]:
    return ["--dataset_name", "iWISDM", "--dataset_config", "iwisdm_identify_category", "--dataset_option",
            f"n_trials={trials}", "--max_new_tokens", "8", "--no_cache"]


def _median(values: List[float]) -> float:
    v = sorted(values)
    return v[len(v) // 2] if len(v) % 2 else (v[len(v) // 2 - 1] + v[len(v) // 2]) / 2


# -- the engine side: runs in the vLLM venv (``--engine_side SPEC``), one engine for everything ---------
def engine_side(spec_path: str) -> int:
    """The offline runs of ``spec["runs"]`` (as ``tests/vllm_runs.py``), then the harness against
    the bare engine and the per-step timings (module docstring). Prints one JSON line per result."""
    import time as _time

    import reform_eval.evaluation.execute
    from reform_eval import run_eval
    from reform_eval.evaluation import calls as calls_module
    from reform_eval.models.interfaces.vllm_interface import VLLMInterface
    from tests import vllm_runs

    with open(spec_path, encoding="utf-8") as f:
        spec = json.load(f)
    reform_eval.evaluation.execute.get_model = vllm_runs.get_model
    for argv in spec["runs"]:
        rc = run_eval.main([str(a) for a in argv])
        print(json.dumps({"run": argv[-1], "rc": rc}), flush=True)
        if rc:
            return rc
    bare = spec.get("bare")
    if not bare:
        return 0
    captured: List[Any] = []
    real_generate = VLLMInterface._generate

    engine_s: List[float] = []  # the harness's engine calls, timed as the bare engine's are

    def capturing(self: Any, requests: List[Dict[str, Any]], params: Any) -> List[Any]:
        t0 = _time.perf_counter()
        outs = real_generate(self, requests, params)
        engine_s.append(_time.perf_counter() - t0)
        captured.append((requests, params, [list(o.outputs[0].token_ids) for o in outs]))
        return outs

    VLLMInterface._generate = capturing

    forward_cpu: List[float] = []
    real_forward = VLLMInterface.forward

    def forward_with_cpu(self: Any, *a: Any, **k: Any) -> Any:  # the CPU time of the interface's forward
        c0 = _time.process_time()
        try:
            return real_forward(self, *a, **k)
        finally:
            forward_cpu.append(_time.process_time() - c0)

    VLLMInterface.forward = forward_with_cpu

    def harness(batch: int, out: str) -> float:
        captured.clear()
        forward_cpu.clear()
        engine_s.clear()
        argv = ["--model", "vllm", "--model_name", "tiny-trained", *bare["data"], "--per_gpu_eval_batch_size",
                str(batch), "--output_dir", out]
        assert run_eval.main(argv) == 0, argv
        return _timing(out)["forward_s"]

    def engine() -> Any:
        (interface,) = vllm_runs._engines.values()
        return interface

    def bare_engine(calls: List[Any]) -> "tuple[float, float, int, int]":
        """Captured requests again, straight to the engine: (seconds, CPU seconds, requests,
        identical)."""
        llm = engine().llm
        seconds, cpu, n, same = 0.0, 0.0, 0, 0
        for requests, params, tokens in calls:
            t0, c0 = _time.perf_counter(), _time.process_time()
            outs = llm.generate(requests, params, use_tqdm=False)
            seconds += _time.perf_counter() - t0
            cpu += _time.process_time() - c0
            n += len(outs)
            same += sum(list(o.outputs[0].token_ids) == t for o, t in zip(outs, tokens))
        return seconds, cpu, n, same

    work = bare["work"]
    harness(max(bare["batches"]), os.path.join(work, "warmup"))  # the engine's caches warm for both sides
    previous: Dict[int, List[Any]] = {}  # per batch size, the last harness run's engine calls
    for rep in range(bare["reps"]):
        for batch in bare["batches"]:
            # which side goes first alternates (on odd repetitions the bare engine, with the previous
            # repetition's requests: the same ones), so going first or second favours neither
            bare_first = rep % 2 == 1 and batch in previous
            if bare_first:
                b, b_cpu, n, same = bare_engine(previous[batch])
            h = harness(batch, os.path.join(work, f"b{batch}_r{rep}"))
            h_cpu = sum(forward_cpu)
            previous[batch] = list(captured)
            if not bare_first:
                b, b_cpu, n, same = bare_engine(previous[batch])
            print(json.dumps({"batch": batch, "rep": rep, "harness_s": h, "harness_engine_s": sum(engine_s), "bare_s": b,
                              "harness_cpu_s": h_cpu, "bare_first": bare_first,
                              "bare_cpu_s": b_cpu, "samples": n, "identical": same}), flush=True)

    # the steps of the batch loop, timed in one more batch-128 run (exclusive times: a step called
    # inside another, such as a tokenizer call inside the trace, counts as itself)
    interface = engine()
    steps: Dict[str, float] = {}
    stack: List[List[float]] = []

    def timed(owner: Any, name: str, step: str) -> None:
        fn = getattr(owner, name)

        def wrapper(*a: Any, **k: Any) -> Any:
            stack.append([0.0])
            t0 = _time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                spent = _time.perf_counter() - t0
                inner = stack.pop()[0]
                steps[step] = steps.get(step, 0.0) + spent - inner
                if stack:
                    stack[-1][0] += spent
        setattr(owner, name, wrapper)

    renderer = type(interface.renderer)
    timed(renderer, "render", "render")
    timed(renderer, "_images", "images")
    timed(type(interface.tokenizer), "__call__", "tokenize")
    timed(type(interface.batch_tokenizer), "ids", "tokenize")
    timed(VLLMInterface, "_request", "request")
    VLLMInterface._generate = real_generate
    timed(VLLMInterface, "_generate", "engine")
    for name in ("decode", "batch_decode"):
        timed(interface.tokenizer, name, "decode")
    timed(VLLMInterface, "_trace", "trace")
    timed(calls_module, "checked_outputs", "check")
    forward = harness(max(bare["batches"]), os.path.join(work, "steps"))
    steps = {k: round(v, 4) for k, v in steps.items()}
    steps["other"] = round(forward - sum(steps.values()), 4)
    print(json.dumps({"steps": steps, "forward_s": round(forward, 4)}), flush=True)
    return 0


def main(argv: List[str] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=16, help="iWISDM trials per identification preset (default: 16)")
    ap.add_argument("--bare_trials", type=int, default=128,
                    help="identify_category trials of the harness-against-bare-engine rows (default: 128)")
    ap.add_argument("--reps", type=int, default=3, help="repetitions of the harness-against-bare rows (default: 3)")
    ap.add_argument("--engines", default="hf,vllm,served",
                    help="which of hf, vllm, served to measure (default: all; vllm includes the bare engine)")
    ap.add_argument("--smoke", action="store_true", help="2 trials per preset (engines still start once)")
    ap.add_argument("--engine_side", help=argparse.SUPPRESS)  # (the vLLM venv's half of the bench)
    args = ap.parse_args(argv)
    if args.engine_side:
        return engine_side(args.engine_side)
    engines = {e.strip() for e in args.engines.split(",") if e.strip()}
    if not engines or engines - {"hf", "vllm", "served"}:
        ap.error(f"--engines: a comma-separated choice of hf, vllm, served, got {args.engines!r}")
    trials = 2 if args.smoke else args.trials
    bare_trials, reps = (16, 1) if args.smoke else (args.bare_trials, args.reps)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("REFORM_NO_CACHE", "1")
    from reform_eval import run_eval

    work = tempfile.mkdtemp(prefix="vllm-bench-")
    data = _data(trials)
    sps: Dict[str, float] = {}
    pairs: Dict[str, Any] = {}
    n = 0

    # in process (this interpreter)
    if "hf" in engines:
        for c in (1, 8):
            out = os.path.join(work, f"hf{c}")
            assert run_eval.main(["--model", "llava", "--model_name", "tiny-trained", *data,
                                  "--per_gpu_eval_batch_size", str(c), "--output_dir", out]) == 0
            n = _records(out)
            sps[f"hf_c{c}"] = n / _timing(out)["forward_s"]
            print(f"in-process c={c}: {n} samples in {_timing(out)['forward_s']:.2f} s", flush=True)
    if engines == {"hf"}:
        pairs["samples"] = n
    else:
        build = subprocess.run(["bash", os.path.join(ROOT, "commands", "vllm_env.sh")], capture_output=True, text=True)
        if build.returncode != 0:
            print(f"vLLM venv unavailable: {build.stderr.strip()}", file=sys.stderr)
            return 1
        vpy = build.stdout.strip().splitlines()[-1]

    # offline engine: every run in one process, one engine start; then the bare engine beside it
    if "vllm" in engines:
        spec = os.path.join(work, "runs.json")
        outs = {c: os.path.join(work, f"vllm{c}") for c in (1, 8)}
        with open(spec, "w", encoding="utf-8") as f:
            json.dump({"runs": [["--model", "vllm", "--model_name", "tiny-trained", *data, "--per_gpu_eval_batch_size",
                                 str(c), "--output_dir", outs[c]] for c in (1, 8)],
                       "bare": {"data": _bare_data(bare_trials), "batches": [8, 128], "reps": reps,
                                "work": os.path.join(work, "bare")}}, f)
        proc = subprocess.run([vpy, os.path.abspath(__file__), "--engine_side", spec], cwd=ROOT, env=_engine_env(),
                              capture_output=True, text=True)
        if proc.returncode != 0:
            print(proc.stdout[-2000:] + proc.stderr[-3000:], file=sys.stderr)
            return 1
        lines = [json.loads(ln) for ln in proc.stdout.splitlines() if ln.startswith("{")]
        vllm_start = _timing(outs[1])["model_load_s"]
        n = _records(outs[1])
        for c in (1, 8):
            sps[f"vllm_c{c}"] = _records(outs[c]) / _timing(outs[c])["forward_s"]
            print(f"vLLM offline c={c}: {_records(outs[c])} samples in {_timing(outs[c])['forward_s']:.2f} s", flush=True)
        rows = [ln for ln in lines if "batch" in ln]
        bare: Dict[str, Any] = {"bare_samples": rows[0]["samples"]}
        for batch in (8, 128):
            mine = [r for r in rows if r["batch"] == batch]
            for r in mine:
                print(f"batch {batch} rep {r['rep']}: harness {r['samples'] / r['harness_s']:.1f} samples/s "
                      f"({r['harness_cpu_s']:.3f} CPU s; {r['harness_s']:.3f} s, of which the engine call "
                      f"{r['harness_engine_s']:.3f} s), bare engine {r['samples'] / r['bare_s']:.1f} samples/s "
                      f"({r['bare_cpu_s']:.3f} CPU s; {r['bare_s']:.3f} s{', went first' if r['bare_first'] else ''}), "
                      f"identical {r['identical']}/{r['samples']}", flush=True)
            bare[f"harness_b{batch}_sps"] = max(r["samples"] / r["harness_s"] for r in mine)
            bare[f"bare_b{batch}_sps"] = max(r["samples"] / r["bare_s"] for r in mine)
        big = [r for r in rows if r["batch"] == 128]
        calls = [r["harness_engine_s"] / r["bare_s"] for r in big]  # the same work, call against call
        own = _median([r["harness_s"] - r["harness_engine_s"] for r in big])
        (steps,) = [ln for ln in lines if "steps" in ln]
        print("steps: " + " ".join(f"{k}={v:.4f}" for k, v in steps["steps"].items())
              + f" (forward_s={steps['forward_s']:.4f}, {rows[0]['samples']} samples, batch 128)", flush=True)
        pairs.update({"samples": n, "vllm_start_s": f"{vllm_start:.1f}", "bare_samples": bare.pop("bare_samples"),
                      **{k: f"{v:.1f}" for k, v in bare.items()},
                      "vllm_vs_bare": f"{bare['harness_b128_sps'] / bare['bare_b128_sps']:.3f}",
                      "vllm_vs_bare_cpu": f"{_median([r['bare_cpu_s'] / r['harness_cpu_s'] for r in big]):.3f}",
                      "harness_own_b128_s": f"{own:.4f}",
                      "engine_call_vs_bare": f"{_median(calls):.3f}",
                      # (one repetition has no spread to show)
                      "engine_call_vs_bare_range": f"{min(calls):.2f}-{max(calls):.2f}" if len(calls) > 1 else "n/a",
                      "own_vs_engine_b128": f"{own / _median([r['bare_s'] for r in big]):.3f}",
                      "identical": f"{sum(r['identical'] for r in rows)}/{sum(r['samples'] for r in rows)}"})

    # a vLLM server
    if "served" in engines:
        engine_path = subprocess.run([vpy, "-m", "reform_eval.models.vllm_checkpoint", "tiny-trained"], cwd=ROOT,
                                     env=_engine_env(), capture_output=True, text=True, check=True
                                     ).stdout.strip().splitlines()[-1]
        port = unused_port()
        log = open(os.path.join(work, "server.log"), "wb")
        t0 = time.perf_counter()
        server = subprocess.Popen([vpy, "-m", "vllm.entrypoints.openai.api_server", "--model", engine_path,
                                   "--served-model-name", "tiny-trained", "--host", "127.0.0.1", "--port", str(port),
                                   "--dtype", "float32", "--enforce-eager", "--seed", "0",
                                   "--mm-processor-kwargs", json.dumps({"backend": "pil"})],
                                  cwd=ROOT, env=_engine_env(), stdout=log, stderr=subprocess.STDOUT,
                                  start_new_session=True)
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
                n = _records(out)
                sps[f"served_c{c}"] = n / _timing(out)["forward_s"]
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
        pairs["served_start_s"] = f"{served_start:.1f}"

    print("| engine | concurrency 1 (samples/s) | concurrency 8 (samples/s) |")
    print("|---|---|---|")
    for key, label in (("hf", "in-process transformers"), ("vllm", "vLLM offline (`--model vllm`)"),
                       ("served", "vLLM server (`--model openai_api`)")):
        if key + "_c1" in sps:
            print(f"| {label} | {sps[key + '_c1']:.1f} | {sps[key + '_c8']:.1f} |")
    line: Dict[str, Any] = {"samples": pairs.pop("samples", n), **{f"{k}_sps": f"{v:.2f}" for k, v in sps.items()}}
    for other in ("vllm", "served"):
        if "hf_c8" in sps and f"{other}_c8" in sps:
            line[f"{other}_vs_hf_c8"] = f"{sps[other + '_c8'] / sps['hf_c8']:.2f}"
    line.update(pairs)
    print(" ".join(f"{k}={v}" for k, v in line.items()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
