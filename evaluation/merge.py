"""Merge and reuse: every record, from a shard line or an existing prediction file, is checked
against the current samples by one checker before it counts as done.

The merge is two writes: the prediction file (atomic), then the shards' removal (one rename,
then the removal of the renamed folder). A kill between them leaves a complete prediction file
beside its shards; the next start sees the file complete and finishes the merge
(``finish_merge``). ``--overwrite`` discards shards, results, then the prediction file, so a
kill part-way leaves an older consistent state, never results without their predictions."""
from __future__ import annotations

import glob
import os
from typing import Any, Callable, Dict, List, Tuple

from .plan import Key, RunPlan
from .reporting.scoring import results_paths
from ..utils.commit import discard
from ..utils.errors import ReformError
from ..utils.predictions import read_predictions, read_shard_dir, record_key, write_json_atomic

SHARD_FIX = "delete that shard file (or pass --overwrite) and re-run"
FILE_FIX = "pass --overwrite to discard it and run again, or use another --output_dir to keep it"


def record_checker(plan: RunPlan, fix: str) -> Callable[[Dict[str, Any], str], Key]:
    """``check(record, where) -> key``: a record must be a prediction of one of the current
    samples, made by this run: its key, run identity, sample fingerprint, answer, options and
    question must match, and it must hold a prediction."""
    want = {plan.key(s): (s, d) for s, d in zip(plan.samples, plan.digests)}

    def check(rec: Dict[str, Any], where: str) -> Key:
        try:
            key = record_key(rec)
        except (KeyError, TypeError, ValueError):
            raise ReformError(f"{where}: not a prediction record (sample_id / dup_index); {fix}") from None
        where = f"{where} (sample {key[0]!r}, duplicate {key[1]})"
        if key not in want:
            raise ReformError(f"{where}: is not in the current dataset build (the data changed?); {fix}")
        sample, digest = want[key]
        if rec.get("run_id") not in (None, plan.run_id):
            raise ReformError(f"{where}: was made by another run ({rec.get('run_id')}); {fix}")
        if "sample_sha" in rec and rec["sample_sha"] != digest[:16]:
            raise ReformError(f"{where}: its sample changed since it was predicted (question, options, answer, "
                              f"images or metadata); {fix}")
        # a context-truncated record carries its shortened question (``context`` says what was dropped)
        fields = ("answer", "answer_options") if rec.get("context") else ("answer", "answer_options", "question")
        for field in fields:
            if field in sample and field in rec and rec[field] != sample[field]:
                raise ReformError(f"{where}: field '{field}' differs from the current sample; {fix}")
        if "prediction" not in rec and not rec.get("skipped"):
            raise ReformError(f"{where}: field 'prediction': missing; {fix}")
        return key
    return check


def check_existing(plan: RunPlan) -> Tuple[Dict[Key, Dict[str, Any]], bool]:
    """Records of an existing prediction file checked against the current samples: (records by
    key, complete). A record of another sample set stops the run with what differs and what to do."""
    records = read_predictions(plan.prediction_file)
    check = record_checker(plan, FILE_FIX)
    by_key: Dict[Key, Dict[str, Any]] = {}
    for i, rec in enumerate(records):
        key = check(rec, f"{plan.prediction_file}: record {i}")
        if key in by_key:
            raise ReformError(f"{plan.prediction_file}: record {i} (sample {key[0]!r}, duplicate {key[1]}): appears "
                              "twice; pass --overwrite to discard the file and run again")
        by_key[key] = rec
    return by_key, len(by_key) == len(plan.samples)


def merge_shards(plan: RunPlan, prior: Dict[Key, Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Rank 0: one record per sample, in dataset order, written atomically; shards removed."""
    done = dict(prior)
    done.update(read_shard_dir(plan.shard_dir, plan.run_id, check=record_checker(plan, SHARD_FIX)))
    missing = [plan.key(s) for s in plan.samples if plan.key(s) not in done]
    if missing:
        raise ReformError(f"{len(missing)} samples have no prediction after all ranks finished "
                          f"(first: {missing[0]}); re-run the same command to complete them")
    records = [done[plan.key(s)] for s in plan.samples]
    write_json_atomic(plan.prediction_file, records)
    finish_merge(plan)
    return records


def finish_merge(plan: RunPlan) -> None:
    """The merge's second write: the shards of a complete prediction file removed (in one rename;
    also at the next start, when a kill came between the two writes)."""
    if os.path.lexists(plan.shard_dir):
        discard(plan.shard_dir)


def remove_prediction_and_results(pred_file: str, output_dir: str) -> None:
    """``--overwrite``: the prediction file and every results file and report named after it."""
    stem = results_paths(pred_file, output_dir)["stem"]
    derived = glob.glob(os.path.join(glob.escape(output_dir), glob.escape(stem) + ".*"))
    # the reverse of the order a commit puts a run's outputs in place (.results.md, .per_sample.json,
    # .report, then the commit point .results.json / .run.json), the prediction file last: a kill
    # part-way never leaves results without their per-sample file, nor either without the predictions
    derived = sorted(set(derived) - {os.path.join(output_dir, os.path.basename(pred_file)), pred_file})
    for path in sorted(derived, key=_removal_rank) + [pred_file]:
        if not os.path.basename(path).startswith(".lock-"):
            discard(path)


#: the suffixes of a run's outputs in the order a commit puts them in place (``scoring.write_results``:
#: staged .results.md, .per_sample.json, then the report; the commit point last)
COMMIT_ORDER = (".results.md", ".per_sample.json", ".report", ".results.json", ".run.json")


def _removal_rank(path: str) -> Tuple[int, str]:
    """Where ``path`` is removed: the commit point first, then backwards through COMMIT_ORDER
    (any other derived file before them all)."""
    for i, suffix in enumerate(COMMIT_ORDER):
        if path.endswith(suffix):
            return (len(COMMIT_ORDER) - min(i, COMMIT_ORDER.index(".results.json")), path)
    return (0, path)
