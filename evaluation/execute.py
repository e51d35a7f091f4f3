"""Execution: this rank's unfinished samples, batch by batch, appended to its JSONL shard.

Batches come from ``plan.plan_batches``: a batch takes only samples whose history is done, so
a multi-turn chat runs turn by turn at any batch size, and a chat stays on one rank.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import time
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

from tqdm import tqdm

from ..build import ReformDataset
from .cache import ResponseCache
from .calls import Runner, save_sample_images  # noqa: F401  (save_sample_images: re-exported)
from .plan import Key, RunPlan, dependencies, directory_fingerprint, model_identity, plan_batches, rank_groups
from .window import run_window
from .runinfo import NOTICE
from ..models import get_model, runs_on_device
from ..utils.cpu_threads import configure_cpu_threads
from ..utils.distributed import DistInfo, barrier, default_device, sample_sharding
from ..utils.errors import Interrupted, ReformError
from ..utils.lifetime import die_with_parent
from ..utils.predictions import ShardWriter, read_shard_dir, trim_torn_line
from ..utils.world import interrupt_of, interrupted_line, interrupts_held, note_progress

logger = logging.getLogger("reform_eval.evaluation.execute")

Check = Callable[[Dict[str, Any], str], Any]


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


def batch_loader(items: Any, batches: List[List[int]], num_workers: int) -> Iterable[List[Any]]:
    """The batches' items in order: decoded here, or by torch DataLoader workers when
    ``--num_workers`` asks for them (torch is imported only then)."""
    if num_workers <= 0:
        return ([items[i] for i in b] for b in batches)
    from torch.utils.data import DataLoader  # heavy: only image-decoding workers need it

    return DataLoader(items, batch_sampler=batches, num_workers=num_workers, collate_fn=_collate,
                      worker_init_fn=die_with_parent)


def model_config(plan: RunPlan, device: str) -> Dict[str, Any]:
    """The config handed to the model factory: the typed model options plus run settings."""
    cfg = plan.config
    return {"model_name": cfg.model.name, "model_type": cfg.model.type,
            "half_evaluation": cfg.model.half_evaluation, "device": device,
            "inference_method": cfg.generation.infer_method, "seed": cfg.generation.seed,
            "batch_size": cfg.generation.batch_size, **cfg.model.options}


def this_ranks_order(plan: RunPlan, done: set, dinfo: DistInfo) -> Tuple[List[int], int]:
    """(this rank's unfinished sample indices in run order, samples left on all ranks)."""
    groups: Dict[str, List[int]] = {}
    for i, s in enumerate(plan.samples):
        if plan.key(s) not in done:
            groups.setdefault(plan.builder.group_key(s), []).append(i)
    order = rank_groups(list(groups.values()), *sample_sharding(dinfo, plan.config.model.options))
    return order, sum(len(g) for g in groups.values())


def history_sources(deps: List[List[Key]]) -> set:
    """The samples whose predictions another sample's history shows (kept while the run lasts)."""
    return {k for d in deps for k in d}


def run_rank(plan: RunPlan, dinfo: DistInfo, prior: Dict[Key, Dict[str, Any]], check: Optional[Check]) -> None:
    """Run this rank's unfinished samples, appending records to its shard; ``prior`` records
    (a partial prediction file) are never run again.

    An in-process model runs batches (``--per_gpu_eval_batch_size``); an interface that takes
    calls one at a time (an endpoint: ``max_in_flight() > 1``) runs a window of calls in flight
    across the whole run (``evaluation.window``)."""
    cfg = plan.config
    if dinfo.is_main and os.path.isdir(plan.shard_dir):
        for name in os.listdir(plan.shard_dir):
            if name.endswith(".jsonl"):
                trim_torn_line(os.path.join(plan.shard_dir, name))
    barrier(dinfo)
    done_records = dict(prior)
    done_records.update(read_shard_dir(plan.shard_dir, plan.run_id, check=check))
    done = set(done_records)
    order, total_todo = this_ranks_order(plan, done, dinfo)
    deps = dependencies(plan.samples, cfg.dataset.history)
    sources = history_sources(deps)
    history = {k: str(r["prediction"]) for k, r in done_records.items() if k in sources}
    # every rank has read the shards before any rank appends to its own: the plan is computed
    # from one state everywhere (a fast rank's first records must not change a slow rank's plan)
    barrier(dinfo)
    if dinfo.is_main:
        logger.info("%d samples, %d already done, %d to run on %d rank(s)", len(plan.samples),
                    len(plan.samples) - total_todo, total_todo, dinfo.world_size)
        if 0 < len(plan.samples) - total_todo:  # the console says so too: the run is not starting over
            logger.info("resumed: %d of %d already done", len(plan.samples) - total_todo, len(plan.samples),
                        extra=NOTICE)
    if not order:
        return
    t0 = time.perf_counter()
    on_device = runs_on_device(cfg.model.family)
    device = default_device(dinfo) if on_device else "cpu"
    if device == "cpu" and on_device:
        plan.timing["cpu_threads"] = configure_cpu_threads()
    interface, preprocessor = get_model(cfg.model.family, model_config(plan, device))
    plan.timing["model_load_s"] = time.perf_counter() - t0
    interface.resume_from(list(done_records.values()), dinfo.world_size)
    del done_records
    cache = open_cache(plan, interface)
    runner = Runner(plan, interface, preprocessor, history, cache)
    show = dinfo.is_main and ((sys.stderr.isatty() and not os.environ.get("CI")) or cfg.output.verbose)
    bar = tqdm(total=len(order), disable=not show, desc=f"{cfg.dataset.name}", unit="sample", leave=False)
    writer = ShardWriter(os.path.join(plan.shard_dir, f"rank{dinfo.rank}-of-{dinfo.world_size}.jsonl"), plan.run_id)
    keys = {i: plan.key(plan.samples[i]) for i in order}
    total = len(plan.samples)
    # what an interrupt says is saved, whichever way it reaches the command line's boundary
    note_progress(lambda: f"{len(done)} of {total} samples are saved")

    def seen(r: Dict[str, Any]) -> None:
        key = (r["sample_id"], r["dup_index"])
        if key in sources:  # before the sample counts as done: a later turn reads it
            history[key] = str(r["prediction"])
        done.add(key)

    def write(records: List[Dict[str, Any]]) -> None:
        writer.write(records)
        bar.update(len(records))

    def cache_ok() -> None:
        if cache is not None:  # the cache's full disk stops the run after the answers are saved
            cache.raise_failure()

    def emit(records: List[Dict[str, Any]]) -> None:
        write(records)
        cache_ok()
        for r in records:
            seen(r)

    window = int(interface.max_in_flight())
    t1 = time.perf_counter()
    batches_in: Any = None
    stopping = False
    try:
        if window > 1:
            dataset = _SafeItems(ReformDataset(plan.samples, plan.builder, lazy_images=True))
            run_window(runner, lambda i: _checked(dataset[i]), order, {i: deps[i] for i in order}, keys, done,
                       seen, write, window, after_write=cache_ok)
        else:
            batches = plan_batches(order, {i: deps[i] for i in order}, keys, set(done), cfg.generation.batch_size)
            # a family that computes nothing from pixels (a baseline) is handed paths, never decoded images
            batches_in = iter(batch_loader(_SafeItems(ReformDataset(plan.samples, plan.builder,
                                                                    lazy_images=not on_device)),
                                           batches, cfg.generation.num_workers))
            for batch in batches_in:
                emit(runner.run([_checked(item) for item in batch]))
    except BaseException as e:
        sig = interrupt_of(e)  # also torch's worker-death error when the whole process group got SIGTERM
        if sig is None:
            raise
        stopping = True
        raise Interrupted(interrupted_line(sig, "running the model")) from None
    finally:
        # stopping on an interrupt: its echoes (a second signal, torch's worker-death error from
        # SIGCHLD) must not replace the line that counts what is saved
        with interrupts_held(child_deaths=True) if stopping else contextlib.nullcontext():
            _close_rank(plan, runner, interface, cache, writer, bar, batches_in, window, t1)


def _close_rank(plan: RunPlan, runner: Runner, interface: Any, cache: Optional[ResponseCache], writer: Any,
                bar: Any, batches_in: Any, window: int, t1: float) -> None:
    """The end of a rank's run, finished or not: workers stopped, timings, files closed, and
    what the model said of itself kept for the run's provenance."""
    stop_workers(batches_in)
    plan.timing["inference_s"] = plan.timing.get("inference_s", 0.0) + time.perf_counter() - t1
    if window > 1:  # the window's calls overlap: its wall time is the forward time
        plan.timing["forward_s"] += time.perf_counter() - t1
        if runner.method == "generation":
            plan.timing["generation_s"] = plan.timing.get("generation_s", 0.0) + time.perf_counter() - t1
    writer.close()
    bar.close()
    interface.close()
    plan.provenance = json.loads(json.dumps(  # JSON as it will be written, whatever a library returned
        {**interface.provenance(), **({"prompt_example": runner.examples["prompt_text"]}
                                      if "prompt_text" in runner.examples else {})}, default=str))
    if cache is not None:
        cache.close()
        plan.cache_stats = {k: plan.cache_stats.get(k, 0) + v for k, v in cache.stats().items()}


def _checked(item: Any) -> Dict[str, Any]:
    """A loaded sample, or the one-line error of one that failed to load (in a worker)."""
    if isinstance(item, _ItemError):
        raise ReformError(item.message)
    return item


def open_cache(plan: RunPlan, interface: Any) -> Optional[ResponseCache]:
    """The response cache of this model (None with --no_cache): keyed by the model's identity and
    the files of the checkpoint it actually loaded (a rebuilt checkpoint is a new model)."""
    cfg = plan.config
    if not cfg.output.use_cache:
        return None
    loaded = directory_fingerprint(getattr(interface, "model_path", None))
    return ResponseCache(cfg.output.cache_dir, model_identity(plan.identity, loaded))
