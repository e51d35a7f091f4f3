"""Execution: this rank's unfinished samples, batch by batch, appended to its JSONL shard.

Batches come from ``plan.plan_batches``: a batch takes only samples whose history is done, so
a multi-turn chat runs turn by turn at any batch size, and a chat stays on one rank.
"""
from __future__ import annotations

import ctypes
import hashlib
import logging
import math
import os
import signal
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
from torch.utils.data import DataLoader
from tqdm import tqdm

from build import ReformDataset
from evaluation.cache import ResponseCache, call_key
from evaluation.context import fit_batch
from evaluation.plan import Key, RunPlan, dependencies, directory_fingerprint, model_identity, plan_batches, rank_groups
from metrics.single_choice import argmax, reduce_scores
from models import get_model
from models.interfaces.base_interface import CandidateScore
from models.outputs import GenText, checked_outputs, generation_stats, model_label
from utils.distributed import DistInfo, barrier, configure_cpu_threads, default_device, sample_sharding
from utils.errors import Interrupted, ReformError
from utils.predictions import ShardWriter, make_record, read_shard_dir, temp_prefix, trim_torn_line
from utils.seeding import derive_seed
from utils.world import interrupt_of

logger = logging.getLogger("evaluation.execute")

Check = Callable[[Dict[str, Any], str], Any]


def fill_history(sample: Dict[str, Any], mode: str, done: Dict[Key, Dict[str, Any]]) -> Dict[str, Any]:
    """In ``model`` mode, replace assistant turns that name a ``source_sample_id`` with that
    sample's own prediction (same duplicate); ``reference`` keeps the reference text."""
    if mode != "model" or not any("source_sample_id" in t for t in sample.get("history", [])):
        return sample
    sample = dict(sample)
    hist = []
    for t in sample["history"]:
        if "source_sample_id" in t:
            key = (str(t["source_sample_id"]), int(sample.get("dup_index", 0)))
            if key not in done:
                raise ReformError(f"sample {sample['sample_id']}: history needs the prediction of "
                                  f"{key[0]}, which has not run (it must come earlier in its group)")
            t = {**t, "value": str(done[key]["prediction"])}
        hist.append(t)
    sample["history"] = hist
    return sample


class _ItemError:
    """A sample that failed to load in a DataLoader worker, carried to the main process as a
    value so the error stays one line (a worker's exception would arrive with a traceback)."""

    def __init__(self, message: str) -> None:
        self.message = message


class _SafeItems:
    """Dataset wrapper: project errors become ``_ItemError`` values."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, idx: int) -> Any:
        try:
            return self.dataset[idx]
        except ReformError as e:
            return _ItemError(str(e))


def _collate(batch: List[Any]) -> List[Any]:
    """Keep the batch as a list; an ``_ItemError`` is raised by the main process."""
    return list(batch)


def die_with_parent(_worker_id: int = 0) -> None:
    """DataLoader worker init: the worker is killed when the run's process dies (even by -9)."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
        if os.getppid() == 1:  # the parent is already gone
            os._exit(1)


def stop_workers(batches: Any) -> None:
    """Stop a DataLoader iterator's workers here, not at garbage collection: when a scheduler's
    SIGTERM reached the workers too, torch's "worker is killed by signal" would otherwise be
    printed after our one line (or replace the interrupt); the interrupt is already being reported."""
    shutdown = getattr(batches, "_shutdown_workers", None)  # multi-process iterators only
    if shutdown is not None:
        try:
            shutdown()
        except (RuntimeError, KeyboardInterrupt):
            pass


def save_sample_images(sample: Dict[str, Any], output_dir: str) -> List[str]:
    """Each in-memory image written once as ``images/<pixel hash>.png``; file images keep their
    file. Returns every image's path relative to the output directory."""
    out = []
    for im in sample.get("images", []):
        if isinstance(im, str):
            out.append(os.path.relpath(os.path.abspath(im), os.path.abspath(output_dir)))
            continue
        digest = hashlib.blake2b(im.tobytes(), digest_size=12).hexdigest()
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


def model_config(plan: RunPlan, device: str) -> Dict[str, Any]:
    """The config handed to the model factory: the typed model options plus run settings."""
    cfg = plan.config
    return {"model_name": cfg.model.name, "model_type": cfg.model.type,
            "half_evaluation": cfg.model.half_evaluation, "device": device,
            "inference_method": cfg.generation.infer_method, "seed": cfg.generation.seed,
            "batch_size": cfg.generation.batch_size, **cfg.model.options}


def this_ranks_batches(plan: RunPlan, done: Dict[Key, Dict[str, Any]], dinfo: DistInfo) -> Tuple[List[List[int]], int]:
    """(this rank's batches of sample indices, samples left on all ranks)."""
    cfg = plan.config
    groups: Dict[str, List[int]] = {}
    for i, s in enumerate(plan.samples):
        if plan.key(s) not in done:
            groups.setdefault(plan.builder.group_key(s), []).append(i)
    order = rank_groups(list(groups.values()), *sample_sharding(dinfo, cfg.model.options))
    deps = dependencies(plan.samples, cfg.dataset.history)
    keys = {i: plan.key(plan.samples[i]) for i in order}
    batches = plan_batches(order, {i: deps[i] for i in order}, keys, set(done), cfg.generation.batch_size)
    return batches, sum(len(g) for g in groups.values())


def run_rank(plan: RunPlan, dinfo: DistInfo, prior: Dict[Key, Dict[str, Any]], check: Optional[Check]) -> None:
    """Run this rank's unfinished samples, appending records to its shard; ``prior`` records
    (a partial prediction file) are never run again."""
    cfg = plan.config
    if dinfo.is_main and os.path.isdir(plan.shard_dir):
        for name in os.listdir(plan.shard_dir):
            if name.endswith(".jsonl"):
                trim_torn_line(os.path.join(plan.shard_dir, name))
    barrier(dinfo)
    done = dict(prior)
    done.update(read_shard_dir(plan.shard_dir, plan.run_id, check=check))
    batches, total_todo = this_ranks_batches(plan, done, dinfo)
    # every rank has read the shards before any rank appends to its own: the plan is computed
    # from one state everywhere (a fast rank's first records must not change a slow rank's plan)
    barrier(dinfo)
    if dinfo.is_main:
        logger.info("%d samples, %d already done, %d to run on %d rank(s)", len(plan.samples),
                    len(plan.samples) - total_todo, total_todo, dinfo.world_size)
    if not batches:
        return
    t0 = time.perf_counter()
    device = default_device(dinfo)
    if device == "cpu":
        plan.timing["cpu_threads"] = configure_cpu_threads()
    interface, preprocessor = get_model(cfg.model.family, model_config(plan, device))
    plan.timing["model_load_s"] = time.perf_counter() - t0
    interface.resume_from(list(done.values()), dinfo.world_size)
    cache = open_cache(plan, interface)
    loop = _BatchLoop(plan, interface, preprocessor, done, cache)
    loader = DataLoader(_SafeItems(ReformDataset(plan.samples, plan.builder)), batch_sampler=batches,
                        num_workers=cfg.generation.num_workers, collate_fn=_collate,
                        worker_init_fn=die_with_parent if cfg.generation.num_workers > 0 else None)
    show = dinfo.is_main and ((sys.stderr.isatty() and not os.environ.get("CI")) or cfg.output.verbose)
    n_mine = sum(len(b) for b in batches)
    bar = tqdm(total=n_mine, disable=not show, desc=f"{cfg.dataset.name}", unit="sample", leave=False)
    writer = ShardWriter(os.path.join(plan.shard_dir, f"rank{dinfo.rank}-of-{dinfo.world_size}.jsonl"), plan.run_id)
    batches_in = iter(loader)
    try:
        for batch in batches_in:
            for item in batch:
                if isinstance(item, _ItemError):
                    raise ReformError(item.message)
            records = loop.run(batch)
            writer.write(records)
            if cache is not None:  # the cache's full disk stops the run after the answers are saved
                cache.raise_failure()
            for r in records:
                done[(r["sample_id"], r["dup_index"])] = r
            bar.update(len(batch))
    except BaseException as e:
        sig = interrupt_of(e)  # also torch's worker-death error when the whole process group got SIGTERM
        if sig is None:
            raise
        how = "" if sig == "SIGINT" else f" ({sig})"
        raise Interrupted(f"interrupted{how}: {len(done)} of {len(plan.samples)} samples are saved; re-running "
                          "the same command resumes from there") from None
    finally:
        stop_workers(batches_in)
        writer.close()
        bar.close()
        if cache is not None:
            cache.close()
            plan.cache_stats = {k: plan.cache_stats.get(k, 0) + v for k, v in cache.stats().items()}


def open_cache(plan: RunPlan, interface: Any) -> Optional[ResponseCache]:
    """The response cache of this model (None with --no_cache): keyed by the model's identity and
    the files of the checkpoint it actually loaded (a rebuilt checkpoint is a new model)."""
    cfg = plan.config
    if not cfg.output.use_cache:
        return None
    loaded = directory_fingerprint(getattr(interface, "model_path", None))
    return ResponseCache(cfg.output.cache_dir, model_identity(plan.identity, loaded))


class _BatchLoop:
    """One batch: history filled from finished turns, context policy, forward, records."""

    def __init__(self, plan: RunPlan, interface: Any, preprocessor: Any, done: Dict[Key, Dict[str, Any]],
                 cache: Optional[ResponseCache] = None) -> None:
        self.plan, self.interface, self.preprocessor, self.done = plan, interface, preprocessor, done
        self.cache = cache
        cfg = plan.config
        self.gen_kwargs: Dict[str, Any] = {"temperature": cfg.generation.temperature}
        if cfg.generation.max_new_tokens is not None:
            self.gen_kwargs["max_new_tokens"] = cfg.generation.max_new_tokens
        self.sample_sha, self.item_sha = plan.sample_sha, plan.item_sha
        self.digest = {plan.key(s): d for s, d in zip(plan.samples, plan.digests)}
        self.label = cfg.model.label

    def finish(self, s: Dict[str, Any], rec: Dict[str, Any]) -> Dict[str, Any]:
        rec["model"] = self.label
        key = self.plan.key(s)
        if key in self.sample_sha:
            rec["sample_sha"] = self.sample_sha[key]
        if key in self.item_sha:  # the item without how it was asked: pairs runs by generation and likelihood
            rec["item_sha"] = self.item_sha[key]
        if self.plan.config.dataset.save_images:
            rec["image_paths"] = save_sample_images(s, self.plan.config.output.output_dir)
        return rec

    def run(self, batch: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
        cfg, timing = self.plan.config, self.plan.timing
        batch = [fill_history(s, cfg.dataset.history, self.done) for s in batch]
        batch, prompts, skipped = fit_batch(batch, self.preprocessor, self.interface, cfg.dataset.context_policy,
                                            cfg.generation.infer_method, self.gen_kwargs, finish=self.finish)
        records = list(skipped)
        if not batch:
            return records
        t1 = time.perf_counter()
        if cfg.generation.infer_method == "generation":
            runs = []
            for j in range(cfg.generation.num_samples):
                seeds = [derive_seed(cfg.generation.seed, s["sample_id"], s["dup_index"], j) for s in batch]
                runs.append(self.cached_forward("generation", batch, prompts, seeds, j))
            timing["forward_s"] += time.perf_counter() - t1
            timing["generation_s"] = timing.get("generation_s", 0.0) + time.perf_counter() - t1
            for k, (s, pr) in enumerate(zip(batch, prompts)):
                outs = [r[k] for r in runs]
                rec = make_record(s, str(outs[0]), pr,
                                  predictions=[str(o) for o in outs] if cfg.generation.num_samples > 1 else None)
                rec.update(_sum_stats([generation_stats(o) for o in outs]))
                records.append(self.finish(s, rec))
        else:
            scores = self.cached_forward("likelihood", batch, prompts, None, 0)
            timing["forward_s"] += time.perf_counter() - t1
            for s, pr, sc in zip(batch, prompts, scores):
                pred = argmax(reduce_scores([x[0] for x in sc], [x[1] for x in sc], cfg.scoring.likelihood_reduction))
                records.append(self.finish(s, make_record(s, pred, pr, scores=sc)))
        return records


    def cached_forward(self, method: str, batch: List[Dict[str, Any]], prompts: List[Any],
                       seeds: Optional[List[int]], index: int) -> List[Any]:
        """The model's outputs for a batch: cached calls served from the cache, the rest run as one
        smaller batch (outputs do not depend on the batch) and stored."""
        if self.cache is None:
            outs = self._forward(method, batch, prompts, seeds)
            self._count(method, outs)
            return outs
        cfg = self.plan.config
        settings = {k: v for k, v in sorted(self.gen_kwargs.items())} if method == "generation" else {}
        # the whole sample (its fingerprint: every field and image) is part of the key, not only
        # the prompt: a baseline answers from the answer or the candidates, which no prompt shows
        keys = [call_key(self.cache.model_key, self.digest[self.plan.key(s)], pr, s.get("images", []), method,
                         s.get("candidates"), settings,
                         derive_seed(cfg.generation.seed, s["sample_id"], s["dup_index"], index), index)
                for s, pr in zip(batch, prompts)]
        found = [self.cache.get(k) for k in keys]
        found = [v if _cached_ok(method, v, s) else None for v, s in zip(found, batch)]
        todo = [i for i, v in enumerate(found) if v is None]
        hits = set(range(len(batch))) - set(todo)
        if todo:
            outs = self._forward(method, [batch[i] for i in todo], [prompts[i] for i in todo],
                                 [seeds[i] for i in todo] if seeds is not None else None)
            self._count(method, outs)
            new = [(keys[i], _to_cache(method, o)) for i, o in zip(todo, outs)]
            self.cache.put_many(new)
            for (_, v), i in zip(new, todo):
                found[i] = v
        return [_from_cache(method, v, i in hits) for i, v in enumerate(found)]

    def _count(self, method: str, outs: List[Any]) -> None:
        """Tokens the model generated in this run (cache hits excluded), for tokens/s."""
        if method == "generation":
            n = [generation_stats(o).get("generated_tokens") for o in outs]
            if all(x is not None for x in n):
                self.plan.timing["generated_tokens"] = self.plan.timing.get("generated_tokens", 0) + sum(n)

    def _forward(self, method: str, batch: List[Dict[str, Any]], prompts: List[Any],
                 seeds: Optional[List[int]]) -> List[Any]:
        with torch.inference_mode():
            if method == "generation":
                outs = self.interface.forward("generation", batch, prompts, seeds=seeds, **self.gen_kwargs)
            else:
                outs = self.interface.forward("likelihood", batch, prompts)
        # refused where it leaves the model, naming model and sample (not later, blaming a file)
        return checked_outputs(model_label(self.interface), method, batch, outs)


def _to_cache(method: str, out: Any) -> Any:
    if method == "generation":
        return {"text": str(out), **generation_stats(out)}
    return [[float(c[0]), int(c[1])] for c in out]


def _cached_ok(method: str, value: Any, sample: Dict[str, Any]) -> bool:
    """A cache entry of the right shape for this call (a hand-edited or foreign line is a miss)."""
    if value is None:
        return False
    if method == "generation":
        return isinstance(value, dict) and isinstance(value.get("text"), str) and \
            isinstance(value.get("generated_tokens", 0), int) and isinstance(value.get("usage", {}), dict)
    n = len(sample.get("candidates") or sample.get("answer_options") or [])
    return isinstance(value, list) and len(value) == n and all(
        isinstance(x, list) and len(x) == 2 and isinstance(x[0], (int, float)) and not isinstance(x[0], bool)
        and math.isfinite(x[0]) and isinstance(x[1], int) and not isinstance(x[1], bool) for x in value)


def _from_cache(method: str, value: Any, hit: bool = False) -> Any:
    if method == "generation":
        usage = value.get("usage")
        if not hit:
            return GenText(value["text"], tokens=value.get("generated_tokens"), usage=usage)
        text = GenText(value["text"], tokens=value.get("generated_tokens"))
        text.cached, text.cached_usage = True, usage  # the call was not made: its tokens not spent now
        return text
    return [CandidateScore(float(lp), int(n)) for lp, n in value]


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
