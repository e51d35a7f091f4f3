"""Evaluate one model on one benchmark: build samples, run the model, merge, score.

Single process: ``python run_eval.py --model llava --model_name tiny --dataset_name iWISDM ...``
Several:        ``torchrun --nproc_per_node=N run_eval.py ...`` (gloo on CPU, nccl on GPU).

This file only orchestrates: samples come from ``build``, prompts from the model's
preprocessor, outputs from ``models``, scores from ``metrics``, file handling from
``utils.predictions``. Each rank appends its records to its own JSONL shard; a re-run of the
same command skips finished samples (whatever the number of ranks); rank 0 merges them into
one prediction file named from a hash of every output-changing argument.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

from utils.errors import ReformError

logger = logging.getLogger("run_eval")

#: arguments that change the predictions; they (and the dataset config's content) name the output
OUTPUT_ARGS = ("model", "model_name", "model_type", "dataset_name", "formulation", "dataset_duplication",
               "in_context_sample", "random_instruct", "shuffle_options", "option_mark", "infer_method",
               "half_evaluation", "temperature", "max_new_tokens", "dataset_subsample", "seed", "history",
               "num_samples", "instructions_at_end", "skip_corrupt", "dataset_option", "model_option",
               "context_policy")


def str2bool(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    if str(v).lower() in ("1", "true", "yes", "y", "on"):
        return True
    if str(v).lower() in ("0", "false", "no", "n", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected a boolean, got '{v}'")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    g = p.add_argument_group("model")
    g.add_argument("--model", required=True, help="model family (registry name), e.g. llava, random, constant")
    g.add_argument("--model_name", default=None, help="checkpoint: local path, offline HF id, or 'tiny'")
    g.add_argument("--model_type", default=None, help="family-specific variant")
    g.add_argument("--model_option", action="append", default=[], metavar="KEY=VALUE",
                   help="extra model config entry (repeatable)")
    g.add_argument("--half_evaluation", action="store_true", help="fp16 on GPU (bf16 on CPU)")
    g = p.add_argument_group("data")
    g.add_argument("--dataset_name", required=True, help="benchmark: iWISDM, MME, MMMT-IF")
    g.add_argument("--formulation", default=None, help="SingleChoice or Generation (default: the benchmark's first)")
    g.add_argument("--dataset_config", default=None, help="YAML dataset config")
    g.add_argument("--dataset_option", action="append", default=[], metavar="KEY=VALUE",
                   help="builder option overriding the config (repeatable; values parsed as YAML)")
    g.add_argument("--dataset_duplication", type=int, default=1, help="copies of each sample (instability)")
    g.add_argument("--in_context_sample", type=str2bool, nargs="?", const=True, default=False,
                   help="prepend a one-shot example exchange")
    g.add_argument("--random_instruct", type=str2bool, nargs="?", const=True, default=True,
                   help="draw the instruction phrasing per duplicate")
    g.add_argument("--shuffle_options", type=str2bool, nargs="?", const=True, default=True,
                   help="shuffle options per duplicate")
    g.add_argument("--option_mark", default="upper", choices=["upper", "lower", "number", "random"])
    g.add_argument("--dataset_subsample", type=int, default=None, help="keep a seeded subset of N base items")
    g.add_argument("--history", default="model", choices=["model", "reference"],
                   help="multi-turn history: the model's own answers or the reference answers")
    g.add_argument("--instructions_at_end", action="store_true",
                   help="MMMT-IF ablation: repeat all given instructions at the end of the input")
    g.add_argument("--skip_corrupt", action="store_true",
                   help="skip (and count in results) images that cannot be decoded instead of failing")
    g.add_argument("--context_policy", default="error", choices=["error", "truncate_history", "skip"],
                   help="a prompt longer than the model context: fail naming the sample, drop the oldest "
                        "turns (images and instructions kept), or skip the sample (counted in results)")
    g = p.add_argument_group("inference")
    g.add_argument("--infer_method", default="generation", choices=["generation", "likelihood"])
    g.add_argument("--per_gpu_eval_batch_size", type=int, default=1)
    g.add_argument("--num_workers", type=int, default=0, help="DataLoader workers (image loading)")
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    g.add_argument("--max_new_tokens", type=int, default=None)
    g.add_argument("--num_samples", type=int, default=1, help="responses per sample (PIF-N-K)")
    g.add_argument("--seed", type=int, default=0)
    g = p.add_argument_group("output and scoring")
    g.add_argument("--output_dir", default="./output/")
    g.add_argument("--overwrite", action="store_true", help="discard an existing prediction file and shards")
    g.add_argument("--do_eval", action="store_true", help="score the merged predictions")
    g.add_argument("--eval_stability", action="store_true", help="report instability (SingleChoice)")
    g.add_argument("--likelihood_reduction", default="sum", choices=["sum", "mean"])
    g.add_argument("--metric_option", action="append", default=[], metavar="KEY=VALUE",
                   help="metric option (repeatable)")
    g.add_argument("--mme_parse", default=None, choices=["official", "stripped", "word"],
                   help="MME answer parsing rule (default: official)")
    g.add_argument("--export_mme_results", default=None, metavar="DIR",
                   help="MME: also write the predictions in the official eval tool's results format")
    return p


def parse_kv(items: Sequence[str], flag: str) -> Dict[str, Any]:
    """``["a=1", "b=x"]`` -> ``{"a": 1, "b": "x"}`` (values parsed as YAML scalars)."""
    import yaml
    out: Dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise ReformError(f"{flag} expects KEY=VALUE, got '{item}'")
        k, v = item.split("=", 1)
        out[k.strip()] = yaml.safe_load(v) if v.strip() else ""
    return out


def validate_args(args: argparse.Namespace) -> None:
    from build.registry import get_builder_class
    from build.schema import FORMULATIONS
    from models import available_models
    from utils.errors import unknown_name
    if args.model not in available_models():
        raise unknown_name("model", args.model, available_models())
    cls = get_builder_class(args.dataset_name)
    args.dataset_name = cls.name
    if args.formulation is None:
        args.formulation = cls.formulations[0]
    if args.formulation not in FORMULATIONS:
        raise unknown_name("formulation", args.formulation, FORMULATIONS)
    for name in ("dataset_duplication", "per_gpu_eval_batch_size", "num_samples"):
        if getattr(args, name) < 1:
            raise ReformError(f"--{name} must be >= 1")
    if getattr(args, "export_mme_results", None) and cls.name != "MME":
        raise ReformError("--export_mme_results needs --dataset_name MME")
    if args.num_samples > 1 and args.infer_method != "generation":
        raise ReformError("--num_samples > 1 needs --infer_method generation")


def output_identity(args: argparse.Namespace, config_content: Dict[str, Any]) -> Tuple[str, Dict[str, Any]]:
    """(hash, identity dict) of everything that changes the predictions."""
    import hashlib
    ident = {k: getattr(args, k) for k in OUTPUT_ARGS}
    ident["dataset_config_content"] = config_content
    blob = json.dumps(ident, sort_keys=True, default=str).encode("utf-8")
    return hashlib.sha256(blob).hexdigest()[:12], ident


def prediction_path(args: argparse.Namespace, digest: str) -> str:
    model_tag = str(args.model_name or args.model).rstrip("/").replace(os.sep, "_").replace(" ", "_")[-40:]
    name = f"{args.dataset_name}_{args.formulation}_{args.infer_method}_{args.model}_{model_tag}_{digest}.json"
    return os.path.join(args.output_dir, name)


def setup_logging(output_dir: str, is_main: bool) -> None:
    root = logging.getLogger()
    root.setLevel(logging.INFO if is_main else logging.WARNING)
    fmt = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not any(isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler)
               for h in root.handlers):
        sh = logging.StreamHandler(sys.stderr)
        sh.setFormatter(fmt)
        root.addHandler(sh)
    for h in [h for h in root.handlers if getattr(h, "_reform_log", False)]:
        root.removeHandler(h)
        h.close()
    if is_main:
        os.makedirs(output_dir, exist_ok=True)
        fh = logging.FileHandler(os.path.join(output_dir, "log.txt"), encoding="utf-8")
        fh.setFormatter(fmt)
        fh._reform_log = True  # type: ignore[attr-defined]
        root.addHandler(fh)


def order_for_rank(groups: List[List[int]], rank: int, world: int) -> List[int]:
    """This rank's sample indices: every world-th group, interleaved by position in the group.

    Interleaving means a batch holds turn t of several chats (all ready together) and a
    sample never runs before an earlier sample of its group.
    """
    mine = groups[rank::world]
    order: List[int] = []
    depth = max((len(g) for g in mine), default=0)
    for pos in range(depth):
        order.extend(g[pos] for g in mine if pos < len(g))
    return order


def fill_history(sample: Dict[str, Any], mode: str, done: Dict[Tuple[str, int], Dict[str, Any]]) -> Dict[str, Any]:
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


def run_inference(args: argparse.Namespace, samples: List[Dict[str, Any]], builder: Any, dinfo: Any,
                  shard_dir: str, timing: Dict[str, float]) -> None:
    """Run this rank's unfinished samples, appending records to its shard."""
    import torch
    from torch.utils.data import DataLoader, Subset

    from build import ReformDataset
    from models import get_model
    from metrics.single_choice import argmax, reduce_scores
    from utils.distributed import barrier, default_device
    from utils.predictions import ShardWriter, make_record, read_shard_dir, trim_torn_line
    from utils.seeding import derive_seed

    if dinfo.is_main and os.path.isdir(shard_dir):
        for name in os.listdir(shard_dir):
            if name.endswith(".jsonl"):
                trim_torn_line(os.path.join(shard_dir, name))
    barrier(dinfo)
    done = read_shard_dir(shard_dir)
    groups: Dict[str, List[int]] = {}
    for i, s in enumerate(samples):
        if (s["sample_id"], s["dup_index"]) not in done:
            groups.setdefault(builder.group_key(s), []).append(i)
    # >>> tensor-parallel hook (issue 12 section 1): tp_plan ranks share one sample stream >>>
    from utils.distributed import sample_sharding
    todo = order_for_rank(list(groups.values()),
                          *sample_sharding(dinfo, parse_kv(args.model_option, "--model_option")))
    # <<< tensor-parallel hook <<<
    total_todo = sum(len(g) for g in groups.values())
    if dinfo.is_main:
        logger.info("%d samples, %d already done, %d to run on %d rank(s)", len(samples),
                    len(samples) - total_todo, total_todo, dinfo.world_size)
    if not todo:
        return

    model_cfg = {"model_name": args.model_name, "model_type": args.model_type,
                 "half_evaluation": args.half_evaluation, "device": default_device(dinfo),
                 "inference_method": args.infer_method, "seed": args.seed,
                 "batch_size": args.per_gpu_eval_batch_size, **parse_kv(args.model_option, "--model_option")}
    t0 = time.perf_counter()
    interface, preprocessor = get_model(args.model, model_cfg)
    timing["model_load_s"] = time.perf_counter() - t0
    gen_kwargs: Dict[str, Any] = {"temperature": args.temperature}
    if args.max_new_tokens is not None:
        gen_kwargs["max_new_tokens"] = args.max_new_tokens

    dataset = ReformDataset(samples, builder)
    loader = DataLoader(Subset(dataset, todo), batch_size=args.per_gpu_eval_batch_size, shuffle=False,
                        num_workers=args.num_workers, collate_fn=list)
    from tqdm import tqdm
    bar = tqdm(total=len(todo), disable=not dinfo.is_main, desc=f"rank0 {args.dataset_name}", unit="sample")
    writer = ShardWriter(os.path.join(shard_dir, f"rank{dinfo.rank}-of-{dinfo.world_size}.jsonl"))
    try:
        for batch in loader:
            batch = [fill_history(s, args.history, done) for s in batch]
            # >>> context policy hook (issue 12 section 4; utils/context.py) >>>
            from utils.context import fit_batch
            n_in = len(batch)
            batch, prompts, skipped = fit_batch(batch, preprocessor, interface, args.context_policy,
                                                args.infer_method, gen_kwargs)
            if skipped:
                writer.write(skipped)
                for r in skipped:
                    done[(r["sample_id"], r["dup_index"])] = r
            if not batch:
                bar.update(n_in)
                continue
            # <<< context policy hook <<<
            records = []
            t1 = time.perf_counter()
            if args.infer_method == "generation":
                runs = []
                for j in range(args.num_samples):
                    seeds = [derive_seed(args.seed, s["sample_id"], s["dup_index"], j) for s in batch]
                    with torch.inference_mode():
                        runs.append(interface.forward("generation", batch, prompts, seeds=seeds, **gen_kwargs))
                timing["forward_s"] += time.perf_counter() - t1
                for k, (s, pr) in enumerate(zip(batch, prompts)):
                    outs = [r[k] for r in runs]
                    records.append(make_record(s, outs[0], pr, predictions=outs if args.num_samples > 1 else None))
            else:
                with torch.inference_mode():
                    scores = interface.forward("likelihood", batch, prompts)
                timing["forward_s"] += time.perf_counter() - t1
                for s, pr, sc in zip(batch, prompts, scores):
                    pred = argmax(reduce_scores([x[0] for x in sc], [x[1] for x in sc], args.likelihood_reduction))
                    records.append(make_record(s, pred, pr, scores=sc))
            writer.write(records)
            for r in records:
                done[(r["sample_id"], r["dup_index"])] = r
            bar.update(n_in)
    finally:
        writer.close()
        bar.close()


def merge_shards(samples: List[Dict[str, Any]], shard_dir: str, pred_file: str) -> List[Dict[str, Any]]:
    """Rank 0: one record per sample, in dataset order, written atomically; shards removed."""
    from utils.predictions import read_shard_dir, write_json_atomic
    done = read_shard_dir(shard_dir)
    missing = [(s["sample_id"], s["dup_index"]) for s in samples if (s["sample_id"], s["dup_index"]) not in done]
    if missing:
        raise ReformError(f"{len(missing)} samples have no prediction after all ranks finished "
                          f"(first: {missing[0]}); re-run the same command to complete them")
    records = [done[(s["sample_id"], s["dup_index"])] for s in samples]
    write_json_atomic(pred_file, records)
    shutil.rmtree(shard_dir, ignore_errors=True)
    return records


def environment_info() -> Dict[str, Any]:
    """Package versions and git revision for results.json."""
    import platform
    import subprocess
    from importlib import metadata
    versions = {"python": platform.python_version()}
    for pkg in ("torch", "transformers", "accelerate", "datasets", "pillow", "tokenizers", "networkx"):
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = None
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True,
                             timeout=10).stdout.strip() or None
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                                    capture_output=True, text=True, timeout=10).stdout.strip())
    except (OSError, subprocess.SubprocessError):
        rev, dirty = None, None
    return {"versions": versions, "git_revision": rev, "git_dirty": dirty}


def score_and_report(records: List[Dict[str, Any]], args: argparse.Namespace, pred_file: str,
                     extra: Dict[str, Any]) -> Dict[str, Any]:
    """Score through the shared metric path, print the table, write results.json/results.md."""
    from run_loader_eval import score_records
    return score_records(records, formulation=args.formulation, infer_method=args.infer_method,
                         eval_stability=args.eval_stability, likelihood_reduction=args.likelihood_reduction,
                         prediction_file=pred_file, output_dir=args.output_dir,
                         metric_options=metric_options_from(args), extra=extra)


def metric_options_from(args: argparse.Namespace) -> Dict[str, Any]:
    """--metric_option pairs plus the named metric flags (--mme_parse)."""
    options = parse_kv(args.metric_option, "--metric_option")
    if getattr(args, "mme_parse", None):
        options["mme_parse"] = args.mme_parse
    return options


def run(args: argparse.Namespace) -> int:
    from build import build_dataset
    from build.registry import load_config
    from utils.distributed import barrier, init_distributed, shutdown
    from utils.predictions import read_predictions

    dinfo = init_distributed()
    setup_logging(args.output_dir, dinfo.is_main)
    validate_args(args)
    config_content, _ = load_config(args.dataset_config)
    builder_options = parse_kv(args.dataset_option, "--dataset_option")
    if args.instructions_at_end:
        builder_options["instructions_at_end"] = True
    if args.skip_corrupt:
        builder_options["skip_corrupt"] = True
    digest, ident = output_identity(args, config_content)
    pred_file = prediction_path(args, digest)
    shard_dir = os.path.join(args.output_dir, f".shards_{digest}")
    timing = {"forward_s": 0.0}
    t_start = time.perf_counter()

    samples, builder = build_dataset(args.dataset_name, args.formulation, args.dataset_config,
                                     inference_method=args.infer_method, in_context_sample=args.in_context_sample,
                                     random_instruct=args.random_instruct, data_duplication=args.dataset_duplication,
                                     shuffle_options=args.shuffle_options, option_mark=args.option_mark,
                                     seed=args.seed, subsample=args.dataset_subsample, **builder_options)
    timing["build_s"] = time.perf_counter() - t_start
    if dinfo.is_main:
        logger.info("command: %s", " ".join(sys.argv))
        logger.info("prediction file: %s", pred_file)

    if os.path.exists(pred_file) and not args.overwrite:
        if dinfo.is_main:
            logger.warning("%s exists: not re-running (pass --overwrite to discard it)", pred_file)
        records = read_predictions(pred_file) if dinfo.is_main else []
    else:
        if args.overwrite:
            if dinfo.is_main:
                shutil.rmtree(shard_dir, ignore_errors=True)
            barrier(dinfo)
        run_inference(args, samples, builder, dinfo, shard_dir, timing)
        barrier(dinfo)
        records = merge_shards(samples, shard_dir, pred_file) if dinfo.is_main else []
        if dinfo.is_main:
            logger.info("wrote %d records to %s", len(records), pred_file)
    timing["total_s"] = time.perf_counter() - t_start
    if dinfo.is_main:
        extra = {"config": {**vars(args), "identity_hash": digest}, "seed": args.seed,
                 "prediction_file": os.path.abspath(pred_file), "build_log": list(builder.build_log),
                 "build_info": dict(getattr(builder, "build_info", {}) or {}),
                 "timing": timing, "world_size": dinfo.world_size, **environment_info()}
        if args.export_mme_results:
            from metrics.mme import write_official_results
            write_official_results(records, args.export_mme_results, likelihood_reduction=args.likelihood_reduction)
            logger.info("wrote MME official-format results to %s", args.export_mme_results)
        if args.do_eval:
            score_and_report(records, args, pred_file, extra)
        else:
            from utils.predictions import write_json_atomic
            write_json_atomic(os.path.join(args.output_dir, "results.json"), extra)
    shutdown(dinfo)
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return run(args)
    except ReformError as e:
        print(f"error: {e}", file=sys.stderr)
        logging.getLogger("run_eval").error("%s", e)
        return e.exit_code


def cli() -> None:
    """Console-script entry point."""
    sys.exit(main())


if __name__ == "__main__":
    cli()
