"""One sample's way through the model: history from finished turns, the context policy, the
response cache, the call itself, and the prediction record with its trace.

Why one home: the run has two schedulers over the same steps, batches for an in-process model
(``evaluation.execute``) and a run-wide window of requests for an endpoint (``evaluation.window``);
both must build the same prompts, keys and records, so both call ``Runner``.
"""
from __future__ import annotations

import math
import os
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

from .cache import ResponseCache, call_key
from .context import fit_sample
from .plan import Key, RunPlan
from ..metrics.single_choice import argmax, reduce_scores
from ..models.interfaces.base_interface import CandidateScore
from ..models.outputs import GenText, checked_outputs, generation_stats, model_label
from ..utils.errors import ReformError
from ..utils.fingerprint import pixel_digest
from ..utils.predictions import make_record, temp_prefix
from ..utils.run_images import verify_run_images
from ..utils.seeding import derive_seed

#: the trace fields a record keeps (``prompt_text`` goes to the run's provenance, once)
TRACE_FIELDS = ("prompt_sha", "prompt_tokens", "bos", "pixel_sha", "image_sizes")

Result = Tuple[Any, Optional[Dict[str, Any]]]


def fill_history(sample: Dict[str, Any], mode: str, history: Dict[Key, str]) -> Dict[str, Any]:
    """In ``model`` mode, replace assistant turns that name a ``source_sample_id`` with that
    sample's own prediction (same duplicate); ``reference`` keeps the reference text."""
    if mode != "model" or not any("source_sample_id" in t for t in sample.get("history", [])):
        return sample
    sample = dict(sample)
    hist = []
    for t in sample["history"]:
        if "source_sample_id" in t:
            key = (str(t["source_sample_id"]), int(sample.get("dup_index", 0)))
            if key not in history:
                raise ReformError(f"sample {sample['sample_id']}: history needs the prediction of "
                                  f"{key[0]}, which has not run (it must come earlier in its group)")
            t = {**t, "value": history[key]}
        hist.append(t)
    sample["history"] = hist
    return sample


def save_sample_images(sample: Dict[str, Any], output_dir: str) -> List[str]:
    """Each in-memory image written once as ``images/<pixel hash>.png`` (``utils.fingerprint.
    pixel_digest``: mode, size and pixels, so two pictures are never one file); file images keep
    their file. Returns every image's path relative to the output directory."""
    out = []
    for im in sample.get("images", []):
        if isinstance(im, str):
            out.append(os.path.relpath(os.path.abspath(im), os.path.abspath(output_dir)))
            continue
        digest = pixel_digest(im)[:24]
        rel = os.path.join("images", f"{digest}.png")
        path = os.path.join(output_dir, rel)
        if not os.path.exists(path):
            try:
                os.makedirs(os.path.dirname(path), exist_ok=True)
            except OSError as e:
                raise ReformError(f"{os.path.dirname(path)}: cannot create the image folder "
                                  f"({e.strerror or e})") from None
            tmp = os.path.join(os.path.dirname(path), temp_prefix(path) + str(os.getpid()) + ".png")
            try:
                im.save(tmp, format="PNG")
                os.replace(tmp, path)
            except OSError as e:
                if os.path.exists(tmp):
                    os.unlink(tmp)
                raise ReformError(f"{path}: cannot save image ({e.strerror or e})") from None
        out.append(rel)
    return out


class Pending:
    """A sample on its way: its prompt, its cache keys, and the results that have arrived."""

    def __init__(self, sample: Dict[str, Any], prompt: Any, keys: List[Optional[str]]) -> None:
        self.sample, self.prompt, self.keys = sample, prompt, keys
        self.results: List[Optional[Result]] = [None] * len(keys)
        self.hits: set = set()

    @property
    def missing(self) -> List[int]:
        return [j for j, r in enumerate(self.results) if r is None]


class Runner:
    """The steps every sample goes through, for either scheduler."""

    def __init__(self, plan: RunPlan, interface: Any, preprocessor: Any, history: Dict[Key, str],
                 cache: Optional[ResponseCache] = None) -> None:
        self.plan, self.interface, self.preprocessor, self.history = plan, interface, preprocessor, history
        self.cache = cache
        cfg = plan.config
        self.method = cfg.generation.infer_method
        self.n_calls = cfg.generation.num_samples if self.method == "generation" else 1
        self.gen_kwargs: Dict[str, Any] = {"temperature": cfg.generation.temperature}
        if cfg.generation.max_new_tokens is not None:
            self.gen_kwargs["max_new_tokens"] = cfg.generation.max_new_tokens
        self.settings = dict(sorted(self.gen_kwargs.items())) if self.method == "generation" else {}
        self.label = cfg.model.label
        self.examples: Dict[str, str] = {}  # a rendered prompt, kept once for the run's provenance
        self._lock = threading.Lock()
        self.model = model_label(interface)  # how errors name the model
        self.stop_retrying(False)  # a new run: an earlier run's stop does not hold for this one

    def stop_retrying(self, stopping: bool = True) -> None:
        """The run is stopping: the interface starts no new attempt of a request (``False``: it may)."""
        stop = getattr(self.interface, "stop_retrying", None)  # (a plain object as the interface has none)
        if stop is not None:
            stop(stopping)

    # -- per sample ---------------------------------------------------------------------
    def seed(self, s: Dict[str, Any], j: int) -> int:
        return derive_seed(self.plan.config.generation.seed, s["sample_id"], s["dup_index"], j)

    def prepare(self, s: Dict[str, Any]) -> Tuple[Optional[Pending], Optional[Dict[str, Any]]]:
        """(the sample's pending calls, None), or (None, its record) when the context policy
        skips it or the cache holds every answer."""
        cfg = self.plan.config
        filled = fill_history(s, cfg.dataset.history, self.history)
        used, prompt, reason = fit_sample(filled, self.preprocessor, self.interface, cfg.dataset.context_policy,
                                          self.method, self.gen_kwargs)
        if reason is not None:
            rec = make_record(used, "", None)
            rec["skipped"] = reason
            return None, self.finish(s, rec)
        keys: List[Optional[str]] = [self.key(used, prompt, j) for j in range(self.n_calls)] \
            if self.cache is not None else [None] * self.n_calls
        pending = Pending(used, prompt, keys)
        verified = False
        for j, k in enumerate(keys):
            if k is None or self.cache is None:
                continue
            value = self.cache.get(k)
            if _cached_ok(self.method, value, used):
                if not verified:  # a cached answer is used only for images the run has read (a miss: the model reads them)
                    verify_run_images(used.get("images"), used.get("sample_id"))
                    verified = True
                pending.results[j] = _from_cache(self.method, value, hit=True)
                pending.hits.add(j)
        if not pending.missing:
            return None, self.record(pending)
        return pending, None

    def key(self, s: Dict[str, Any], prompt: Any, j: int) -> str:
        """The cache key of call ``j`` of a sample: the model, the sample's fingerprint (every
        field and the content of every image), the prompt, the method, candidates, settings,
        seed and response index (``evaluation.cache``)."""
        assert self.cache is not None  # keys are made only with a cache (prepare)
        digest = self.plan.digest_of(self.plan.key(s))
        return call_key(self.cache.model_key, digest, prompt, self.method, s.get("candidates"),
                        self.settings, self.seed(s, j), j)

    def store(self, pending: Pending, j: int, result: Result, checked: bool = False) -> None:
        """An arrived answer, checked where it leaves the model (naming model and sample, not
        later blaming a file), kept for the record and written to the cache at once (a paid reply
        is never lost, even when another call of the same sample fails)."""
        if not checked:
            out = checked_outputs(self.model, self.method, [pending.sample], [result[0]])[0]
            result = (out, result[1])
        pending.results[j] = result
        with self._lock:  # window workers store side by side: one cache segment, one set of counts
            key = pending.keys[j]
            if self.cache is not None and key is not None:
                self.cache.put_many([(key, _to_cache(self.method, *result))])
            self._count([result[0]])

    def call(self, pending: Pending, j: int) -> Result:
        """Call ``j`` of a sample, in the calling thread (a window worker: ``evaluation.window``)."""
        s = pending.sample
        if self.method == "generation":
            return self.interface.call("generation", s, pending.prompt, seed=self.seed(s, j), **self.gen_kwargs)
        return self.interface.call("likelihood", s, pending.prompt)

    def record(self, pending: Pending) -> Dict[str, Any]:
        """The prediction record of a sample whose calls have all been answered."""
        s, pr = pending.sample, pending.prompt
        results = [r for r in pending.results if r is not None]
        if self.method == "generation":
            outs = [r[0] for r in results]
            rec = make_record(s, str(outs[0]), pr,
                              predictions=[str(o) for o in outs] if self.n_calls > 1 else None)
            rec.update(_sum_stats([generation_stats(o) for o in outs]) if len(outs) > 1 else generation_stats(outs[0]))
        else:
            sc = results[0][0]
            pred = argmax(reduce_scores([x[0] for x in sc], [x[1] for x in sc],
                                        self.plan.config.scoring.likelihood_reduction))
            rec = make_record(s, pred, pr, scores=sc)
        trace = results[0][1] if results else None
        if trace:
            if "prompt_text" in trace and not self.examples:
                self.examples["prompt_text"] = str(trace["prompt_text"])
            rec["trace"] = {k: trace.get(k) for k in TRACE_FIELDS}
            # the images' content as the run fingerprinted it: known alike for every engine
            rec["trace"]["image_sha"] = self.plan.image_sha_of(self.plan.key(s))
        return self.finish(s, rec)

    def finish(self, s: Dict[str, Any], rec: Dict[str, Any]) -> Dict[str, Any]:
        rec["model"] = self.label
        key = self.plan.key(s)
        sha = self.plan.sample_sha_of(key)
        if sha:
            rec["sample_sha"] = sha
        item = self.plan.item_sha_of(key)
        if item:  # the item without how it was asked: pairs runs by generation and likelihood
            rec["item_sha"] = item
        if self.plan.config.dataset.save_images:
            rec["image_paths"] = save_sample_images(s, self.plan.config.output.output_dir)
        return rec

    # -- a batch (in-process models) --------------------------------------------------------
    def run(self, batch: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
        """Every sample of a batch: cached calls served from the cache, the rest run as one
        smaller batch per response index (outputs do not depend on the batch) and stored."""
        records: List[Dict[str, Any]] = []
        pending: List[Pending] = []
        for s in batch:
            p, rec = self.prepare(s)
            if rec is not None:
                records.append(rec)
            else:
                assert p is not None  # prepare gives a record or what is still to call
                pending.append(p)
        if not pending:
            return records
        timing = self.plan.timing
        t1 = time.perf_counter()
        for j in range(self.n_calls):
            todo = [p for p in pending if p.results[j] is None]
            if not todo:
                continue
            samples, prompts = [p.sample for p in todo], [p.prompt for p in todo]
            if self.method == "generation":
                outs = self.interface.forward("generation", samples, prompts,
                                              seeds=[self.seed(s, j) for s in samples], **self.gen_kwargs)
            else:
                outs = self.interface.forward("likelihood", samples, prompts)
            # refused where it leaves the model, naming model and sample (not later, blaming a file)
            outs = checked_outputs(self.model, self.method, samples, outs)
            traces = self.interface.take_traces() or [None] * len(outs)
            for p, out, trace in zip(todo, outs, traces):
                self.store(p, j, (out, trace), checked=True)
        elapsed = time.perf_counter() - t1
        timing["forward_s"] += elapsed
        if self.method == "generation":
            timing["generation_s"] = timing.get("generation_s", 0.0) + elapsed
        records.extend(self.record(p) for p in pending)
        return records

    def _count(self, outs: List[Any]) -> None:
        """Tokens the model generated in this run (cache hits excluded), for tokens/s."""
        if self.method == "generation":
            n = [generation_stats(o).get("generated_tokens") for o in outs]
            counted = [x for x in n if x is not None]
            if len(counted) == len(n):
                self.plan.timing["generated_tokens"] = self.plan.timing.get("generated_tokens", 0) + sum(counted)


def _to_cache(method: str, out: Any, trace: Optional[Dict[str, Any]]) -> Any:
    value: Dict[str, Any] = {"text": str(out), **generation_stats(out)} if method == "generation" else \
        {"scores": [[float(c[0]), int(c[1])] for c in out]}
    if trace:
        value["trace"] = {k: trace.get(k) for k in TRACE_FIELDS}
    return value


def _cached_ok(method: str, value: Any, sample: Dict[str, Any]) -> bool:
    """A cache entry of the right shape for this call (a hand-edited or foreign line is a miss)."""
    if not isinstance(value, dict) or not isinstance(value.get("trace", {}), dict):
        return False
    if method == "generation":
        return isinstance(value.get("text"), str) and isinstance(value.get("generated_tokens", 0), int) \
            and isinstance(value.get("usage", {}), dict)
    scores = value.get("scores")
    n = len(sample.get("candidates") or sample.get("answer_options") or [])
    return isinstance(scores, list) and len(scores) == n and all(
        isinstance(x, list) and len(x) == 2 and isinstance(x[0], (int, float)) and not isinstance(x[0], bool)
        and math.isfinite(x[0]) and isinstance(x[1], int) and not isinstance(x[1], bool) for x in scores)


def _from_cache(method: str, value: Any, hit: bool = False) -> Result:
    trace = value.get("trace") or None
    if method == "generation":
        usage = value.get("usage")
        if not hit:
            return GenText(value["text"], tokens=value.get("generated_tokens"), usage=usage), trace
        text = GenText(value["text"], tokens=value.get("generated_tokens"))
        text.cached, text.cached_usage = True, usage  # the call was not made: its tokens not spent now
        return text, trace
    return [CandidateScore(float(lp), int(n)) for lp, n in value["scores"]], trace


def _sum_stats(stats: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Token counts and usage of a sample's responses, added up (several responses: PIF-N-K)."""
    out: Dict[str, Any] = {}
    if stats and all("generated_tokens" in s for s in stats):
        out["generated_tokens"] = sum(s["generated_tokens"] for s in stats)
    for field in ("usage", "cached_usage"):
        usages = [s[field] for s in stats if field in s]
        if usages:
            total: Dict[str, Any] = {}
            for u in usages:
                for k, v in u.items():
                    if isinstance(v, (int, float)) and not isinstance(v, bool):
                        total[k] = total.get(k, 0) + v
            out[field] = total
    cached = sum(s.get("cached_responses", 0) for s in stats)
    if cached:
        out["cached_responses"] = cached
    return out
