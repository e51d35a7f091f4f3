"""Several ``run_eval`` command lines in one process that starts the vLLM engine once.

Usage, with the vLLM venv's python (``commands/vllm_env.sh``)::

    $VLLM_PY tests/vllm_runs.py SPEC.json

``SPEC.json``: ``{"runs": [[run_eval argument, ...], ...]}``. Each run goes through
``run_eval.main`` (the command line a user runs); prints one JSON line per run, ``{"rc": exit code,
"seconds": wall time}``, then one ``{"provenance": ..., "traces": ...}`` line per engine (its
``provenance()``, and the traces the last run recorded in its prediction file). Why: starting vLLM costs about a minute on this machine, and the engine
tests and ``bench/vllm_throughput.py`` need several runs; so the model factory is memoised for
``--model vllm``: a later run with the same model options reuses the first run's interface (its
engine), everything else is the user's path. Runs of other families are not touched.
"""
from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, Dict, Optional, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import reform_eval.evaluation.execute  # noqa: E402
from reform_eval import models  # noqa: E402
from reform_eval import run_eval  # noqa: E402

_real_get_model = models.get_model
_engines: Dict[str, Any] = {}
#: run settings that do not change the engine
_PER_RUN = ("inference_method", "batch_size", "seed", "device")


def get_model(name: str, config: Optional[Dict[str, Any]] = None) -> Tuple[Any, Any]:
    """``models.get_model``, with one ``vllm`` interface per distinct set of model options."""
    if name != "vllm":
        return _real_get_model(name, config)
    cfg = dict(config or {})
    key = json.dumps({k: v for k, v in cfg.items() if k not in _PER_RUN}, sort_keys=True, default=str)
    if key not in _engines:
        _engines[key] = _real_get_model(name, cfg)[0]
    interface = _engines[key]
    return interface, interface.make_preprocessor(cfg)


def main(spec_path: str) -> int:
    with open(spec_path, encoding="utf-8") as f:
        runs = json.load(f)["runs"]
    reform_eval.evaluation.execute.get_model = get_model
    worst = 0
    for argv in runs:
        t0 = time.perf_counter()
        rc = run_eval.main([str(a) for a in argv])
        print(json.dumps({"rc": rc, "seconds": round(time.perf_counter() - t0, 3)}), flush=True)
        worst = worst or rc
    last = [str(a) for a in runs[-1]]
    out = last[last.index("--output_dir") + 1]
    traces = []
    for name in sorted(os.listdir(out)):
        if name.endswith(".json") and name.count(".") == 1:  # the prediction file (not results, run info)
            with open(os.path.join(out, name), encoding="utf-8") as f:
                traces += [r.get("trace") for r in json.load(f)]
    for interface in _engines.values():
        print(json.dumps({"provenance": interface.provenance(), "traces": traces}, default=str), flush=True)
    return worst


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
