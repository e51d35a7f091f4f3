"""The run as a library: ``evaluate(config) -> RunResult`` and ``score(files) -> ScoreResult``.

``run_eval.py`` and ``run_loader_eval.py`` are thin shells over these two calls:

    from reform_eval.evaluation import RunConfig, ModelConfig, DatasetConfig, evaluate
    result = evaluate(RunConfig(model=ModelConfig("random"), dataset=DatasetConfig("iWISDM", config="iwisdm_low")))
    result.metrics, result.prediction_file

One run: validate (nothing written on bad input) -> plan (samples, identity, names) -> reuse
checks -> execute (batches per rank, multi-turn dependencies respected) -> merge -> score ->
report. Under torchrun every rank calls ``evaluate``; rank 0 merges, scores and reports.
"""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence

from .config import RunConfig, check_writable_dir
from .execute import run_rank
from .merge import (SHARD_FIX, check_existing, finish_merge, merge_shards, record_checker,
                              remove_prediction_and_results)
from .plan import Key, RunPlan, make_plan, read_dataset_config
from .reporting.report import write_run_report
from .reporting.scoring import (RUN_INDEX, check_export, evaluate_files, export_results, index_entry,
                                          results_paths, run_eval_tag, run_name, score_records)
from .runinfo import environment_info, keep_original_run_info, setup_logging
from ..utils.distributed import DistInfo, all_gather_objects, barrier, init_distributed, shutdown
from ..utils.errors import ReformError, stage
from ..utils.file_hashes import forget_fingerprints
from .trackers import log_run
from ..utils.commit import Commit, clean_stale_temps, discard
from ..utils.usage import usage_totals
from ..utils.invocation import command_for
from ..utils.predictions import ensure_writable_dir, remove_stale_temps
from ..utils.report import scalar_table
from ..utils.secrets import redact
from ..utils.runlock import RunLock

logger = logging.getLogger("reform_eval.evaluation.engine")


@dataclass
class RunResult:
    """What one ``evaluate`` call produced (on rank 0; other ranks get ``prediction_file`` only)."""

    prediction_file: str
    run_id: str
    reused: bool = False
    num_records: int = 0
    metrics: Dict[str, Any] = field(default_factory=dict)
    results_files: Dict[str, str] = field(default_factory=dict)
    report: Optional[str] = None
    run_info: Optional[str] = None
    summary: Dict[str, Any] = field(default_factory=dict)

    def console_text(self) -> str:
        """What the console shows by default: the headline table, and where everything went."""
        lines = []
        if self.reused:
            lines.append(f"predictions reused from {self.prediction_file} (pass --overwrite to run again)")
        if self.results_files:
            s = self.summary
            title = f"{s.get('benchmark', '')} {s.get('formulation', '')} {s.get('infer_method', '')}".strip()
            lines += [f"## {title}", "", scalar_table(self.metrics, s.get("notes")), "",
                      f"results: {self.results_files['json']} (every table: {self.results_files['md']})"]
            if self.report:
                lines.append(f"report: {self.report}")
        elif self.num_records:
            lines.append(f"predictions: {self.prediction_file}\nto score them: {command_for('run_loader_eval')} "
                         f"--prediction_file {self.prediction_file}  (or re-run this command with --do_eval)")
        return "\n".join(lines)


@dataclass
class ScoreResult:
    """What one ``score`` call produced: each run's results, and the comparison of several."""

    runs: List[Dict[str, Any]]
    comparison: Optional[Dict[str, Any]] = None
    release_report: Optional[Any] = None


class SetupError(ReformError):
    """An input error met before any rank diverges (every rank meets it alike: rank 0 reports it)."""

    every_rank = True


def evaluate(config: RunConfig, dinfo: Optional[DistInfo] = None) -> RunResult:
    """Run one evaluation: the config is validated, then planned, executed, merged and scored."""
    cfg = _setup_checked(config.validated)
    config_path, content = _setup_checked(lambda: read_dataset_config(cfg))  # before anything is written
    gpus_per_rank = cfg.model.options.get("gpus_per_rank", 1)
    dinfo = dinfo or init_distributed(gpus_per_rank=gpus_per_rank)
    _setup_checked(lambda: check_writable_dir(cfg.output.output_dir, "--output_dir"))
    t_start = time.perf_counter()
    forget_fingerprints()  # what the files held is promised by this run's fingerprint only
    with stage("building the samples"):  # bad data is found before the output folder is made
        plan = _setup_checked(lambda: make_plan(cfg, config_path, content))
    plan.timing["build_s"] = time.perf_counter() - t_start
    if cfg.scoring.export_mme_results:  # an export folder of another run is refused before any work
        _setup_checked(lambda: check_export([], "MME", cfg.scoring.export_mme_results, plan.prediction_file))
    if dinfo.is_main:
        _setup_checked(lambda: ensure_writable_dir(cfg.output.output_dir, "--output_dir"))
    barrier(dinfo)
    _setup_checked(lambda: setup_logging(cfg.output.output_dir, dinfo.is_main, cfg.output.verbose))
    if dinfo.is_main:
        logger.info("command: %s", cfg.command_line())
        for line in plan.builder.build_log:
            logger.info("build: %s", line)
        logger.info("run identity %s (data fingerprint %s); prediction file: %s", plan.run_id,
                    plan.fingerprint[:12], plan.prediction_file)
        if cfg.dataset.subsample:
            logger.info("--dataset_subsample %d: whole groups drawn (%d samples)", cfg.dataset.subsample,
                        len(plan.samples))
    lock = RunLock(cfg.output.output_dir, plan.run_id)
    if dinfo.is_main:
        lock.acquire()
    try:
        result = _run_locked(plan, dinfo, t_start)
    finally:
        lock.release()
        forget_fingerprints()
    shutdown(dinfo)
    return result


def _setup_checked(step: Any) -> Any:
    """Run a set-up step; its input error is marked as met by every rank alike."""
    try:
        return step()
    except SetupError:
        raise
    except ReformError as e:
        e.every_rank = True  # type: ignore[attr-defined]
        raise


def _run_locked(plan: RunPlan, dinfo: DistInfo, t_start: float) -> RunResult:
    cfg = plan.config
    pred_file = plan.prediction_file
    if dinfo.is_main:
        clean_stale_temps(cfg.output.output_dir, depth=2)  # any temporary of ours a killed command left
        for path in (pred_file, *results_paths(pred_file).values()):
            if isinstance(path, str) and path.endswith((".json", ".md")):
                remove_stale_temps(path)
        if cfg.output.overwrite:  # the discarded predictions take their results and report with them
            discard(plan.shard_dir)
            remove_prediction_and_results(pred_file, cfg.output.output_dir)
    barrier(dinfo)
    prior: Dict[Any, Dict[str, Any]] = {}
    complete = False
    if os.path.exists(pred_file):
        with stage(f"checking the existing {pred_file}"):
            prior, complete = check_existing(plan)
        add_item_sha(plan, prior)
    if complete:
        records = [prior[plan.key(s)] for s in plan.samples]
        if dinfo.is_main:
            finish_merge(plan)  # a kill between the merge's two writes left the shards behind
            logger.info("%s holds every sample's prediction for this run identity: reused "
                        "(pass --overwrite to run again)", pred_file)
    else:
        if prior and dinfo.is_main:
            logger.info("%s holds %d of %d predictions: completing it", pred_file, len(prior), len(plan.samples))
        with stage("running the model"):
            run_rank(plan, dinfo, prior, record_checker(plan, SHARD_FIX))
        barrier(dinfo)
        if dinfo.enabled:  # every rank's cache hits and misses, and generated tokens
            totals: Dict[str, int] = {}
            tokens = []
            for stats, n in all_gather_objects(dinfo, (plan.cache_stats, plan.timing.get("generated_tokens"))):
                tokens.append(n)
                for k, v in stats.items():
                    totals[k] = totals.get(k, 0) + v
            plan.cache_stats = totals
            if any(n is not None for n in tokens):
                plan.timing["generated_tokens"] = sum(n or 0 for n in tokens)
            # every rank has finished the gather before any rank may tear its process group down
            # (a rank leaving while a peer still receives aborts the peer)
            barrier(dinfo)
        with stage("merging the shards"):
            records = merge_shards(plan, prior) if dinfo.is_main else []
        if dinfo.is_main:
            logger.info("wrote %d records to %s", len(records), pred_file)
    plan.timing["total_s"] = time.perf_counter() - t_start
    # the samples are done with: the records hold what scoring needs, and the two are never
    # kept together (at 50,000 samples each is about 150 MB; issue 24, flat memory)
    plan.release_samples()
    prior = {}
    result = RunResult(prediction_file=pred_file, run_id=plan.run_id, reused=complete, num_records=len(records))
    if dinfo.is_main:
        with stage("scoring and writing the report"):
            _finish(plan, records, complete, dinfo, result)
    return result


def add_item_sha(plan: RunPlan, records: Dict[Key, Dict[str, Any]]) -> None:
    """Records written before ``item_sha`` existed get it where their ``sample_sha`` proves them
    the current sample, so a reused or completed old file pairs with new runs by item."""
    items, samples = plan.item_sha, plan.sample_sha
    for key, rec in records.items():
        if "item_sha" not in rec and key in items and rec.get("sample_sha") == samples.get(key):
            rec["item_sha"] = items[key]


def _run_info(plan: RunPlan, dinfo: DistInfo, complete: bool) -> Dict[str, Any]:
    cfg = plan.config
    paths = results_paths(plan.prediction_file, cfg.output.output_dir)
    extra = {"config": {**cfg.flags(), "identity_hash": plan.run_id}, "command": cfg.command_line(),
             "run_id": plan.run_id, "data_fingerprint": plan.fingerprint, "seed": cfg.generation.seed,
             "prediction_file": os.path.abspath(plan.prediction_file), "build_log": list(plan.builder.build_log),
             "build_info": dict(getattr(plan.builder, "build_info", {}) or {}),
             "timing": plan.timing, "world_size": dinfo.world_size, **environment_info()}
    if plan.provenance:
        extra["provenance"] = plan.provenance
    if plan.checkpoint_source:  # a hub id: the snapshot (commit) the run's identity fingerprinted
        extra["checkpoint_source"] = plan.checkpoint_source
        if "provenance" in extra:
            extra["provenance"] = {**extra["provenance"], "checkpoint_source": plan.checkpoint_source}
    if plan.cache_stats:
        extra["response_cache"] = dict(plan.cache_stats, directory=cfg.output.cache_dir)
    tokens, seconds = plan.timing.get("generated_tokens"), plan.timing.get("generation_s")
    if tokens is not None and seconds:
        extra["throughput"] = {"generated_tokens": int(tokens), "generation_s": round(seconds, 3),
                               "tokens_per_s": round(tokens / seconds, 2)}
    extra = keep_original_run_info(extra, paths) if complete else extra
    if "provenance" in extra:  # what a server said of itself (its model id, Server header) may echo a credential
        extra["provenance"] = redact(extra["provenance"])
    return extra


def _finish(plan: RunPlan, records: List[Dict[str, Any]], complete: bool, dinfo: DistInfo, result: RunResult) -> None:
    """Rank 0: export, score and report, or record how to score later: every output of this
    command is one unit (``utils.commit``), in place together or not at all."""
    cfg = plan.config
    s = cfg.scoring
    extra = _run_info(plan, dinfo, complete)
    if any("usage" in r or "generated_tokens" in r for r in records):  # tokens, and cost with a price table
        o = cfg.model.options
        extra["usage"] = usage_totals(records, o.get("prompt_price"), o.get("completion_price"))
    if s.export_mme_results:  # refused before anything is written when the records are not MME's
        check_export(records, "MME", s.export_mme_results, plan.prediction_file)
    with Commit(f"outputs of {plan.prediction_file}") as commit:
        if s.export_mme_results:
            export_results(records, "MME", s.export_mme_results, prediction_file=plan.prediction_file,
                           commit=commit, likelihood_reduction=s.likelihood_reduction)
        if s.do_eval:
            summary = score_records(records, formulation=cfg.dataset.formulation,
                                    infer_method=cfg.generation.infer_method, eval_stability=s.eval_stability,
                                    likelihood_reduction=s.likelihood_reduction, prediction_file=plan.prediction_file,
                                    output_dir=cfg.output.output_dir, metric_options=dict(s.metric_options),
                                    extra=extra, tool="run_eval", quiet=True, commit=commit,
                                    tag=run_eval_tag(s.likelihood_reduction, s.eval_stability, dict(s.metric_options)))
            run = {"name": run_name(records, plan.prediction_file), "records": records, "result": summary}
            stem = os.path.basename(summary["results_files"]["json"])[:-len(".results.json")]
            report = write_run_report(run, os.path.join(cfg.output.output_dir, stem + ".report"), commit=commit)
            result.metrics = summary["metrics"]
            result.results_files = dict(summary["results_files"])
            result.report = report["files"].get("report_html")
            result.summary = {**summary, "benchmark": records[0].get("benchmark", "") if records else ""}
        else:
            paths = results_paths(plan.prediction_file, cfg.output.output_dir)
            if not (complete and os.path.exists(paths["run"])):
                commit.write_json(paths["run"], extra, last=True)
            commit.append_line(os.path.join(cfg.output.output_dir, RUN_INDEX), index_entry({
                "tool": "run_eval", "prediction_file": os.path.abspath(plan.prediction_file),
                "run_info": paths["run"], "run_id": plan.run_id}))
            result.run_info = paths["run"]
    if s.export_mme_results:
        logger.info("wrote MME official-format results to %s", s.export_mme_results)
    if result.results_files:
        logger.info("results: %s%s", result.results_files["json"], f"; report: {result.report}" if result.report else "")
        if s.log_to:
            with stage(f"logging to {s.log_to}"):
                logged = log_run(s.log_to, result.summary, {
                    "report_dir": os.path.dirname(result.report) if result.report else "",
                    "prediction_file": plan.prediction_file, "results_json": result.results_files["json"]})
            logger.info("logged to %s: %s", s.log_to, logged.get("location"))


def score(files: Sequence[str], formulation: Optional[str] = None, infer_method: Optional[str] = None,
          eval_stability: bool = False, likelihood_reduction: str = "sum", dataset_name: Optional[str] = None,
          output_dir: Optional[str] = None, metric_options: Optional[Dict[str, Any]] = None,
          export_mme_results: Optional[str] = None, seed: int = 0, n_boot: int = 1000,
          quiet: bool = False, log_to: Optional[str] = None) -> ScoreResult:
    """Score prediction files offline (each gets its own results); several runs are compared."""
    out = evaluate_files(list(files), formulation=formulation, infer_method=infer_method,
                         eval_stability=eval_stability, likelihood_reduction=likelihood_reduction,
                         dataset_name=dataset_name, output_dir=output_dir, metric_options=metric_options,
                         export_mme_results=export_mme_results, seed=seed, n_boot=n_boot, quiet=quiet)
    result = ScoreResult(runs=out.get("runs", []), comparison=out.get("comparison"),
                         release_report=out.get("release_report"))
    if log_to:
        for run in result.runs:
            summary = run["result"]
            with stage(f"logging to {log_to}"):
                log_run(log_to, summary, {"prediction_file": summary.get("prediction_file") or "",
                                          "results_json": (summary.get("results_files") or {}).get("json", "")},
                        run_name=run["name"])
    return result
