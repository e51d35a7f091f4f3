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
import math
import os
import shutil
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from utils.errors import ReformError
from utils.options import metric_options, parse_kv

logger = logging.getLogger("run_eval")

#: arguments that change the predictions; they (and the dataset config's content) name the output
OUTPUT_ARGS = ("model", "model_name", "model_type", "dataset_name", "formulation", "dataset_duplication",
               "in_context_sample", "random_instruct", "shuffle_options", "option_mark", "infer_method",
               "half_evaluation", "temperature", "max_new_tokens", "dataset_subsample", "seed", "history",
               "num_samples", "instructions_at_end", "skip_corrupt", "dataset_option", "model_option",
               "save_images", "context_policy")


#: model options that decide where and how fast a model runs, never what it outputs: left out of
#: the run identity, so moving a run to other devices (or a faster endpoint) resumes it
PLACEMENT_OPTIONS = ("device_map", "max_memory", "offload_folder", "gpus_per_rank", "tp_plan", "max_concurrency",
                     "timeout", "max_retries", "backoff_base", "backoff_max")


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
    g.add_argument("--dataset_name", required=True,
                   help=f"benchmark (case-insensitive): {', '.join(dataset_names())}")
    g.add_argument("--formulation", default=None,
                   help="SingleChoice or Generation, case-insensitive (default: the benchmark's first)")
    g.add_argument("--dataset_config", default=None,
                   help="YAML dataset config: a path, or the name of a shipped one "
                        f"({', '.join(shipped_config_names())})")
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
    g.add_argument("--dataset_subsample", type=int, default=None,
                   help="keep a seeded subset of N whole groups: MME images (both questions), MMMT-IF chats "
                        "(all turns), iWISDM trials, custom items")
    g.add_argument("--history", default="model", choices=["model", "reference"],
                   help="multi-turn history: the model's own answers or the reference answers")
    g.add_argument("--instructions_at_end", action="store_true",
                   help="MMMT-IF ablation: repeat all given instructions at the end of the input")
    g.add_argument("--skip_corrupt", action="store_true",
                   help="skip (and count in results) images that cannot be decoded instead of failing "
                        "(custom and MME; MMMT-IF has check_images/skip_bad_chats, iWISDM generates its frames)")
    g.add_argument("--save_images", action="store_true",
                   help="write each sample's in-memory images (iWISDM frames) once under OUTPUT_DIR/images/ and "
                        "record every image's path, relative to the output directory, in the prediction records")
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
    g.add_argument("-v", "--verbose", action="store_true", help="more console output (library logs, loading bars)")
    return p


def dataset_names() -> List[str]:
    """Every registered dataset name (for --help)."""
    from build.registry import BUILDERS
    import build  # noqa: F401  (registers the builders)
    return sorted(BUILDERS)


def shipped_config_names() -> List[str]:
    from build.registry import shipped_configs
    return sorted(shipped_configs())


def _check_number(args: argparse.Namespace, name: str, minimum: float, integer: bool = True) -> None:
    v = getattr(args, name)
    if v is None:
        return
    if not math.isfinite(v) or v < minimum:
        raise ReformError(f"--{name} must be a {'whole ' if integer else 'finite '}number >= "
                          f"{int(minimum) if integer else minimum}, got {v}")


def validate_args(args: argparse.Namespace) -> None:
    """Names and values, checked before anything is built, loaded or written."""
    from build.registry import get_builder_class
    from utils.schema import FORMULATIONS
    from models import available_models
    from utils.errors import unknown_name
    if args.model not in available_models():
        raise unknown_name("model", args.model, available_models())
    cls = get_builder_class(args.dataset_name)
    args.dataset_name = cls.name
    if args.formulation is None:
        args.formulation = cls.formulations[0]
    by_lower = {f.lower(): f for f in FORMULATIONS}
    if str(args.formulation).lower() not in by_lower:
        raise unknown_name("formulation", args.formulation, FORMULATIONS)
    args.formulation = by_lower[str(args.formulation).lower()]
    for name in ("dataset_duplication", "per_gpu_eval_batch_size", "num_samples", "dataset_subsample",
                 "max_new_tokens"):
        _check_number(args, name, 1)
    _check_number(args, "num_workers", 0)
    if args.dataset_duplication > 1000:
        raise ReformError(f"--dataset_duplication {args.dataset_duplication}: at most 1000 copies of a sample")
    _check_number(args, "temperature", 0.0, integer=False)
    if getattr(args, "export_mme_results", None) and cls.name != "MME":
        raise ReformError("--export_mme_results needs --dataset_name MME")
    if args.num_samples > 1 and args.infer_method != "generation":
        raise ReformError("--num_samples > 1 needs --infer_method generation")
    if args.eval_stability and args.dataset_duplication < 2:
        raise ReformError("--eval_stability needs --dataset_duplication >= 2: instability is measured across "
                          "duplicates of a sample, and with one copy it would read 0")
    if os.path.exists(args.output_dir) and not os.path.isdir(args.output_dir):
        raise ReformError(f"{args.output_dir}: --output_dir exists and is not a directory")


def prepare_output_dir(path: str) -> None:
    """Create the output directory and check it is writable, before any work is done."""
    from utils.predictions import ensure_writable_dir
    ensure_writable_dir(path, "--output_dir")


def check_writable_dir(path: str, flag: str) -> None:
    """A directory flag that will be written later: refuse a file there, or an unwritable parent."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise ReformError(f"{path}: {flag} exists and is not a directory")
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent) or not os.access(parent, os.W_OK | os.X_OK):
        raise ReformError(f"{path}: {flag} cannot be created ({parent} is not a writable directory)")


def output_identity(args: argparse.Namespace, config_content: Dict[str, Any],
                    data_fingerprint: str = "") -> Tuple[str, Dict[str, Any]]:
    """(hash, identity dict) of everything that changes the predictions: the arguments, the
    dataset config's content and a fingerprint of the built samples and their images.
    Credentials are left out (a new API key must not start a new run)."""
    import hashlib
    from utils.secrets import drop_secrets
    ident = {k: getattr(args, k, None) for k in OUTPUT_ARGS}
    ident["model_option"] = [o for o in (args.model_option or [])
                             if o.split("=", 1)[0].strip() not in PLACEMENT_OPTIONS]
    from models import identity_env
    ident["model_env"] = identity_env(args.model)
    ident["checkpoint"] = checkpoint_fingerprint(args.model_name)
    ident["dataset_config_content"] = config_content
    ident["data_fingerprint"] = data_fingerprint
    ident = drop_secrets(ident)
    blob = json.dumps(ident, sort_keys=True, default=str).encode("utf-8")
    return hashlib.sha256(blob).hexdigest()[:12], ident


def checkpoint_fingerprint(model_name: Optional[str]) -> Optional[List[Tuple[str, int, int]]]:
    """(file, size, mtime) of a local checkpoint directory's files: new weights in the same
    directory are a new run, never the old predictions."""
    if not model_name or not os.path.isdir(str(model_name)):
        return None
    out = []
    for root, _, files in os.walk(str(model_name)):
        for name in sorted(files):
            path = os.path.join(root, name)
            try:
                st = os.stat(path)
            except OSError:
                continue
            out.append((os.path.relpath(path, str(model_name)), st.st_size, st.st_mtime_ns))
    return sorted(out)


def prediction_path(args: argparse.Namespace, digest: str) -> str:
    model_tag = str(args.model_name or args.model).rstrip("/").replace(os.sep, "_").replace(" ", "_")[-40:]
    name = f"{args.dataset_name}_{args.formulation}_{args.infer_method}_{args.model}_{model_tag}_{digest}.json"
    return os.path.join(args.output_dir, name)


def model_label(args: argparse.Namespace) -> str:
    """How records and comparison tables name the model: family, plus checkpoint where given."""
    if not args.model_name:
        return str(args.model)
    return f"{args.model}:{os.path.basename(str(args.model_name).rstrip('/')) or args.model_name}"


class _RedactFilter(logging.Filter):
    """Credentials never reach a log line (console or log.txt)."""

    def filter(self, record: logging.LogRecord) -> bool:
        from utils.secrets import redact_text
        msg = record.getMessage()
        clean = redact_text(msg)
        if clean != msg:
            record.msg, record.args = clean, None
        return True


def setup_logging(output_dir: str, is_main: bool, verbose: bool = False) -> None:
    """Console: this program's INFO lines on rank 0 (library chatter only with -v); log.txt: all."""
    logging.raiseExceptions = False  # a full disk must not print a traceback per log line
    root = logging.getLogger()
    root.setLevel(logging.INFO if is_main else logging.WARNING)
    fmt = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not any(isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler)
               for h in root.handlers):
        sh = logging.StreamHandler(sys.stderr)
        sh.setFormatter(fmt)
        sh._reform_console = True  # type: ignore[attr-defined]
        root.addHandler(sh)
    for h in root.handlers:
        if getattr(h, "_reform_console", False):
            h.setLevel(logging.INFO if verbose else logging.WARNING)
    for h in root.handlers:
        if not any(isinstance(f, _RedactFilter) for f in h.filters):
            h.addFilter(_RedactFilter())
    for h in [h for h in root.handlers if getattr(h, "_reform_log", False)]:
        root.removeHandler(h)
        h.close()
    quiet_libraries(verbose)
    if is_main:
        try:
            fh = logging.FileHandler(os.path.join(output_dir, "log.txt"), encoding="utf-8")
        except OSError as e:
            raise ReformError(f"{os.path.join(output_dir, 'log.txt')}: cannot write the log ({e.strerror or e})") from None
        fh.setFormatter(fmt)
        fh.addFilter(_RedactFilter())
        fh._reform_log = True  # type: ignore[attr-defined]
        root.addHandler(fh)


def quiet_libraries(verbose: bool) -> None:
    """No weight-loading bars or library warnings on the console unless -v."""
    if verbose:
        return
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    for name in ("transformers", "accelerate", "datasets", "huggingface_hub", "torch.distributed"):
        logging.getLogger(name).setLevel(logging.ERROR)
    try:
        import transformers
        transformers.logging.set_verbosity_error()
        transformers.logging.disable_progress_bar()
    except ImportError:
        pass


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


class _ItemError:
    """A sample that failed to load in a DataLoader worker, carried to the main process as a
    value so the error stays one line (a worker's exception would arrive with a traceback)."""

    def __init__(self, message: str) -> None:
        self.message = message


class _SafeItems:
    """Dataset wrapper for run_eval: project errors become ``_ItemError`` values."""

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
    """Keep the batch as a list; an ``_ItemError`` is raised by the main process (a raise here
    would run inside the worker and arrive wrapped in its traceback)."""
    return list(batch)


def _raise_item_errors(batch: List[Any]) -> None:
    for item in batch:
        if isinstance(item, _ItemError):
            raise ReformError(item.message)


def die_with_parent(_worker_id: int = 0) -> None:
    """DataLoader worker init: the worker is killed when the run's process dies (even by -9)."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
        if os.getppid() == 1:  # the parent is already gone
            os._exit(1)


def save_sample_images(sample: Dict[str, Any], output_dir: str) -> List[str]:
    """Each in-memory image written once as ``images/<pixel hash>.png``; file images keep their
    file. Returns every image's path relative to the output directory."""
    import hashlib
    out = []
    for im in sample.get("images", []):
        if isinstance(im, str):
            out.append(os.path.relpath(os.path.abspath(im), os.path.abspath(output_dir)))
            continue
        digest = hashlib.blake2b(im.tobytes(), digest_size=12).hexdigest()
        rel = os.path.join("images", f"{digest}.png")
        path = os.path.join(output_dir, rel)
        if not os.path.exists(path):
            from utils.predictions import temp_prefix
            os.makedirs(os.path.dirname(path), exist_ok=True)
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


def model_config(args: argparse.Namespace, device: str) -> Dict[str, Any]:
    """The config handed to the model factory (``--model_option`` was checked when the run started)."""
    options = parse_kv(args.model_option, "--model_option")
    return {"model_name": args.model_name, "model_type": args.model_type,
            "half_evaluation": args.half_evaluation, "device": device,
            "inference_method": args.infer_method, "seed": args.seed,
            "batch_size": args.per_gpu_eval_batch_size, **options}


def run_inference(args: argparse.Namespace, samples: List[Dict[str, Any]], builder: Any, dinfo: Any,
                  shard_dir: str, timing: Dict[str, float], run_id: Optional[str] = None,
                  prior: Optional[Dict[Tuple[str, int], Dict[str, Any]]] = None,
                  digests: Optional[List[str]] = None) -> None:
    """Run this rank's unfinished samples, appending records to its shard.

    ``prior``: records already done (a partial prediction file), never run again.
    """
    import torch
    from torch.utils.data import DataLoader, Subset

    from build import ReformDataset
    from models import get_model
    from metrics.single_choice import argmax, reduce_scores
    from utils.distributed import barrier, default_device
    from evaluation.context import fit_batch
    from utils.predictions import ShardWriter, make_record, read_shard_dir, trim_torn_line
    from utils.seeding import derive_seed

    if dinfo.is_main and os.path.isdir(shard_dir):
        for name in os.listdir(shard_dir):
            if name.endswith(".jsonl"):
                trim_torn_line(os.path.join(shard_dir, name))
    barrier(dinfo)
    done = dict(prior or {})
    done.update(read_shard_dir(shard_dir, run_id, check=shard_check(samples, digests, run_id)))
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

    model_cfg = model_config(args, default_device(dinfo))
    t0 = time.perf_counter()
    interface, preprocessor = get_model(args.model, model_cfg)
    timing["model_load_s"] = time.perf_counter() - t0
    gen_kwargs: Dict[str, Any] = {"temperature": args.temperature}
    if args.max_new_tokens is not None:
        gen_kwargs["max_new_tokens"] = args.max_new_tokens
    sample_sha = {(s["sample_id"], s["dup_index"]): d[:16] for s, d in zip(samples, digests or [])}
    label = model_label(args)

    dataset = _SafeItems(ReformDataset(samples, builder))
    loader = DataLoader(Subset(dataset, todo), batch_size=args.per_gpu_eval_batch_size, shuffle=False,
                        num_workers=args.num_workers, collate_fn=_collate,
                        worker_init_fn=die_with_parent if args.num_workers > 0 else None)
    from tqdm import tqdm
    show = dinfo.is_main and (sys.stderr.isatty() or getattr(args, "verbose", False))
    bar = tqdm(total=len(todo), disable=not show, desc=f"rank0 {args.dataset_name}", unit="sample")
    writer = ShardWriter(os.path.join(shard_dir, f"rank{dinfo.rank}-of-{dinfo.world_size}.jsonl"), run_id)

    def finish(s: Dict[str, Any], rec: Dict[str, Any]) -> Dict[str, Any]:
        rec["model"] = label
        key = (s["sample_id"], s["dup_index"])
        if key in sample_sha:
            rec["sample_sha"] = sample_sha[key]
        if args.save_images:
            rec["image_paths"] = save_sample_images(s, args.output_dir)
        return rec

    try:
        for batch in loader:
            _raise_item_errors(batch)
            batch = [fill_history(s, args.history, done) for s in batch]
            n_in = len(batch)
            batch, prompts, skipped = fit_batch(batch, preprocessor, interface, args.context_policy,
                                                args.infer_method, gen_kwargs, finish=finish)
            if skipped:
                writer.write(skipped)
                for r in skipped:
                    done[(r["sample_id"], r["dup_index"])] = r
            if not batch:
                bar.update(n_in)
                continue
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
                    records.append(finish(s, make_record(s, outs[0], pr,
                                                         predictions=outs if args.num_samples > 1 else None)))
            else:
                with torch.inference_mode():
                    scores = interface.forward("likelihood", batch, prompts)
                timing["forward_s"] += time.perf_counter() - t1
                for s, pr, sc in zip(batch, prompts, scores):
                    pred = argmax(reduce_scores([x[0] for x in sc], [x[1] for x in sc], args.likelihood_reduction))
                    records.append(finish(s, make_record(s, pred, pr, scores=sc)))
            writer.write(records)
            for r in records:
                done[(r["sample_id"], r["dup_index"])] = r
            bar.update(n_in)
    finally:
        writer.close()
        bar.close()


def shard_check(samples: List[Dict[str, Any]], digests: Optional[List[str]], run_id: Optional[str]
                ) -> Optional[Callable[[Dict[str, Any], str], Any]]:
    """The per-line check of shard records (None without the run's fingerprints)."""
    if digests is None or run_id is None:
        return None
    return record_checker(samples, digests, run_id, "delete that shard file (or pass --overwrite) and re-run")


def merge_shards(samples: List[Dict[str, Any]], shard_dir: str, pred_file: str, run_id: Optional[str] = None,
                 prior: Optional[Dict[Tuple[str, int], Dict[str, Any]]] = None,
                 digests: Optional[List[str]] = None) -> List[Dict[str, Any]]:
    """Rank 0: one record per sample, in dataset order, written atomically; shards removed."""
    from utils.predictions import read_shard_dir, write_json_atomic
    done = dict(prior or {})
    done.update(read_shard_dir(shard_dir, run_id, check=shard_check(samples, digests, run_id)))
    missing = [(s["sample_id"], s["dup_index"]) for s in samples if (s["sample_id"], s["dup_index"]) not in done]
    if missing:
        raise ReformError(f"{len(missing)} samples have no prediction after all ranks finished "
                          f"(first: {missing[0]}); re-run the same command to complete them")
    records = [done[(s["sample_id"], s["dup_index"])] for s in samples]
    write_json_atomic(pred_file, records)
    shutil.rmtree(shard_dir, ignore_errors=True)
    return records


def remove_prediction_and_results(pred_file: str, output_dir: str) -> None:
    """``--overwrite``: the prediction file and every results file and report named after it."""
    import glob
    from evaluation.reporting.scoring import results_paths
    stem = results_paths(pred_file, output_dir)["stem"]
    victims = [pred_file] + glob.glob(os.path.join(glob.escape(output_dir), glob.escape(stem) + ".*"))
    for path in victims:
        if os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
        elif os.path.exists(path) and not os.path.basename(path).startswith(".lock-"):
            os.unlink(path)


def record_checker(samples: List[Dict[str, Any]], digests: List[str], run_id: str, fix: str
                   ) -> Callable[[Dict[str, Any], str], Tuple[str, int]]:
    """``check(record, where) -> key``: a record (from a prediction file or a shard line) must be
    a prediction of one of the current samples, made by this run: its key, run identity, sample
    fingerprint, answer, options and question must match, and it must hold a prediction."""
    from utils.predictions import record_key
    want = {(s["sample_id"], s["dup_index"]): (s, d) for s, d in zip(samples, digests)}

    def check(rec: Dict[str, Any], where: str) -> Tuple[str, int]:
        try:
            key = record_key(rec)
        except (KeyError, TypeError, ValueError):
            raise ReformError(f"{where}: not a prediction record (sample_id / dup_index); {fix}") from None
        where = f"{where} (sample {key[0]!r}, duplicate {key[1]})"
        if key not in want:
            raise ReformError(f"{where}: is not in the current dataset build (the data changed?); {fix}")
        sample, digest = want[key]
        if rec.get("run_id") not in (None, run_id):
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


def check_existing(pred_file: str, samples: List[Dict[str, Any]], digests: List[str], run_id: str
                   ) -> Tuple[Dict[Tuple[str, int], Dict[str, Any]], bool]:
    """Records of an existing prediction file checked against the current samples.

    Returns (records by key, complete). A record of another sample set (other ids, answers,
    options, or a changed sample fingerprint) stops the run with what differs and what to do.
    """
    from utils.predictions import read_predictions
    records = read_predictions(pred_file)
    check = record_checker(samples, digests, run_id,
                           "pass --overwrite to discard it and run again, or use another --output_dir to keep it")
    by_key: Dict[Tuple[str, int], Dict[str, Any]] = {}
    for i, rec in enumerate(records):
        key = check(rec, f"{pred_file}: record {i}")
        if key in by_key:
            raise ReformError(f"{pred_file}: record {i} (sample {key[0]!r}, duplicate {key[1]}): appears twice; "
                              "pass --overwrite to discard the file and run again")
        by_key[key] = rec
    return by_key, len(by_key) == len(samples)


def environment_info() -> Dict[str, Any]:
    """Package versions and git revision for the results file."""
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


def metric_options_from(args: argparse.Namespace) -> Dict[str, Any]:
    """--metric_option pairs plus the named metric flags (--mme_parse)."""
    return metric_options(args.metric_option, getattr(args, "mme_parse", None))


def run(args: argparse.Namespace) -> int:
    """Set up the process group and run; an error of the set-up phase (bad input, which every
    rank meets alike) is marked so that only rank 0 prints it."""
    from utils.distributed import init_distributed

    gpus_per_rank = parse_kv(args.model_option, "--model_option").get("gpus_per_rank", 1)
    if isinstance(gpus_per_rank, bool) or not isinstance(gpus_per_rank, int) or gpus_per_rank < 1:
        raise ReformError(f"--model_option gpus_per_rank: must be a whole number >= 1, got {gpus_per_rank!r}")
    dinfo = init_distributed(gpus_per_rank=gpus_per_rank)
    args.setup_phase = True
    try:
        return _run(args, dinfo)
    except ReformError as e:
        if getattr(args, "setup_phase", False):
            e.every_rank = True  # type: ignore[attr-defined]
        raise


def _run(args: argparse.Namespace, dinfo: Any) -> int:
    from build import build_dataset
    from build.registry import load_config, resolve_config
    from metrics import check_metric_options, metric_for
    from utils.distributed import barrier, shutdown
    from utils.fingerprint import samples_fingerprint
    from utils.predictions import remove_stale_temps
    from evaluation.reporting.scoring import (append_run_index, export_results, results_paths, run_eval_tag,
                                         score_records)
    from utils.runlock import RunLock
    from utils.secrets import redact

    # every name, value and option is checked before anything is written
    validate_args(args)
    config_path = resolve_config(args.dataset_config, args.dataset_name)
    config_content, _ = load_config(config_path)
    builder_options = parse_kv(args.dataset_option, "--dataset_option")
    if args.instructions_at_end:
        builder_options["instructions_at_end"] = True
    if args.skip_corrupt:
        builder_options["skip_corrupt"] = True
    from build.registry import get_builder_class
    builder_cls = get_builder_class(args.dataset_name)
    for flag, key in (("--skip_corrupt", "skip_corrupt"), ("--instructions_at_end", "instructions_at_end")):
        if key in builder_options and builder_cls.option_names is not None and key not in builder_cls.option_names:
            raise ReformError(f"{flag} does not apply to {builder_cls.name} (it takes none of that option; valid "
                              f"options: {', '.join(sorted(builder_cls.option_names))})")
    builder_cls.check_option_names(config_content, config_path or "<dataset config>")
    builder_cls.check_option_names(builder_options, "--dataset_option")
    builder_cls.check_option_values(config_content, config_path or "<dataset config>")
    builder_cls.check_option_values(builder_options, "--dataset_option")
    metric_options = metric_options_from(args)
    check_metric_options(metric_for(args.dataset_name, args.formulation), metric_options)
    from models import check_model_options
    check_model_options(args.model, parse_kv(args.model_option, "--model_option"))
    if args.export_mme_results:
        check_writable_dir(args.export_mme_results, "--export_mme_results")
    if dinfo.is_main:
        prepare_output_dir(args.output_dir)
    barrier(dinfo)
    setup_logging(args.output_dir, dinfo.is_main, getattr(args, "verbose", False))
    timing = {"forward_s": 0.0}
    t_start = time.perf_counter()

    samples, builder = build_dataset(args.dataset_name, args.formulation, config_path,
                                     inference_method=args.infer_method, in_context_sample=args.in_context_sample,
                                     random_instruct=args.random_instruct, data_duplication=args.dataset_duplication,
                                     shuffle_options=args.shuffle_options, option_mark=args.option_mark,
                                     seed=args.seed, subsample=args.dataset_subsample, extra_options=builder_options)
    fingerprint, digests = samples_fingerprint(samples)
    args.setup_phase = False  # from here on an error may be one rank's own (an image, a sample)
    digest, ident = output_identity(args, config_content, fingerprint)
    pred_file = prediction_path(args, digest)
    shard_dir = os.path.join(args.output_dir, f".shards_{digest}")
    timing["build_s"] = time.perf_counter() - t_start
    if dinfo.is_main:
        logger.info("command: %s", " ".join(sys.argv))
        logger.info("run identity %s (data fingerprint %s); prediction file: %s", digest, fingerprint[:12], pred_file)
        if args.dataset_subsample:
            logger.info("--dataset_subsample %d: whole groups drawn (%d samples)", args.dataset_subsample, len(samples))

    lock = RunLock(args.output_dir, digest)
    if dinfo.is_main:
        lock.acquire()
    try:
        prior: Dict[Tuple[str, int], Dict[str, Any]] = {}
        complete = False
        if dinfo.is_main:
            for path in (pred_file, *results_paths(pred_file).values()):
                if isinstance(path, str) and path.endswith((".json", ".md")):
                    remove_stale_temps(path)
            if args.overwrite:  # the discarded predictions take their results and report with them
                shutil.rmtree(shard_dir, ignore_errors=True)
                remove_prediction_and_results(pred_file, args.output_dir)
        barrier(dinfo)
        if os.path.exists(pred_file):
            prior, complete = check_existing(pred_file, samples, digests, digest)
        if complete:
            records = [prior[(s["sample_id"], s["dup_index"])] for s in samples]
            if dinfo.is_main:
                logger.info("%s holds every sample's prediction for this run identity: reused "
                            "(pass --overwrite to run again)", pred_file)
        else:
            if prior and dinfo.is_main:
                logger.warning("%s holds %d of %d predictions: completing it", pred_file, len(prior), len(samples))
            run_inference(args, samples, builder, dinfo, shard_dir, timing, run_id=digest, prior=prior,
                          digests=digests)
            barrier(dinfo)
            records = merge_shards(samples, shard_dir, pred_file, digest, prior, digests) if dinfo.is_main else []
            if dinfo.is_main:
                logger.info("wrote %d records to %s", len(records), pred_file)
        timing["total_s"] = time.perf_counter() - t_start
        if dinfo.is_main:
            extra = {"config": redact({**vars(args), "identity_hash": digest}), "run_id": digest,
                     "data_fingerprint": fingerprint, "seed": args.seed,
                     "prediction_file": os.path.abspath(pred_file), "build_log": list(builder.build_log),
                     "build_info": dict(getattr(builder, "build_info", {}) or {}),
                     "timing": timing, "world_size": dinfo.world_size, **environment_info()}
            if complete:
                extra = keep_original_run_info(extra, pred_file, args.output_dir)
            if args.export_mme_results:
                export_results(records, "MME", args.export_mme_results, likelihood_reduction=args.likelihood_reduction)
                logger.info("wrote MME official-format results to %s", args.export_mme_results)
            if args.do_eval:
                result = score_records(records, formulation=args.formulation, infer_method=args.infer_method,
                                       eval_stability=args.eval_stability,
                                       likelihood_reduction=args.likelihood_reduction, prediction_file=pred_file,
                                       output_dir=args.output_dir, metric_options=metric_options, extra=extra,
                                       tool="run_eval", tag=run_eval_tag(args.likelihood_reduction,
                                                                         args.eval_stability, metric_options))
                report = write_single_report(result, records, pred_file, args.output_dir)
                logger.info("results: %s%s", result["results_files"]["json"],
                            f"; report: {report}" if report else "")
            else:
                from utils.predictions import write_json_atomic
                paths = results_paths(pred_file, args.output_dir)
                if not (complete and os.path.exists(paths["run"])):
                    write_json_atomic(paths["run"], extra)
                append_run_index(args.output_dir, {"tool": "run_eval", "prediction_file": os.path.abspath(pred_file),
                                                   "run_info": paths["run"], "run_id": digest})
                print(f"predictions: {pred_file}\nto score them: python run_loader_eval.py --prediction_file "
                      f"{pred_file}  (or re-run this command with --do_eval)")
    finally:
        lock.release()
    shutdown(dinfo)
    return 0


#: what describes how predictions were made (kept when a later command only re-scores them)
RUN_INFO_KEYS = ("config", "timing", "world_size", "versions", "git_revision", "git_dirty", "build_log", "build_info",
                 "seed", "data_fingerprint")


def keep_original_run_info(extra: Dict[str, Any], pred_file: str, output_dir: str) -> Dict[str, Any]:
    """A reused prediction file keeps the configuration, versions and timing of the run that made
    it (from its ``.run.json`` or results file); this command's own settings go under ``rescored``."""
    from evaluation.reporting.scoring import results_paths
    paths = results_paths(pred_file, output_dir)
    for path in (paths["run"], paths["json"]):
        try:
            with open(path, encoding="utf-8") as f:
                original = json.load(f)
        except (OSError, ValueError):
            continue
        if isinstance(original, dict) and original.get("run_id") == extra.get("run_id"):
            kept = {k: original[k] for k in RUN_INFO_KEYS if k in original}
            return {**extra, **kept, "rescored": {"time": time.strftime("%Y-%m-%dT%H:%M:%S"),
                                                  "config": extra["config"], "versions": extra.get("versions")}}
    return extra


def write_single_report(result: Dict[str, Any], records: List[Dict[str, Any]], pred_file: str,
                        output_dir: str) -> Optional[str]:
    """The report of one run (tables, plots, report.html) in ``<stem>.report/`` beside its results."""
    from evaluation.reporting.compare import write_run_report
    from evaluation.reporting.scoring import results_paths, run_name
    run = {"name": run_name(records, pred_file), "records": records, "result": result}
    out = os.path.join(output_dir, os.path.basename(result["results_files"]["json"])[:-len(".results.json")] + ".report")
    return write_run_report(run, out)["files"].get("report_html")


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return run(args)
    except ReformError as e:
        return report_error(e)
    except Exception as e:  # noqa: BLE001  (only a peer's failure seen through the process group)
        import torch.distributed as dist
        if os.environ.get("WORLD_SIZE", "1") != "1" and isinstance(e, (dist.DistError, RuntimeError)) \
                and not isinstance(e, ReformError):
            # another rank failed and printed its one-line error; this rank stops quietly
            logger.debug("stopped after a peer failed: %s", e)
            return 1
        raise


def report_error(e: ReformError) -> int:
    """The error once, as the last line on stderr (the log file gets it too); the exit status."""
    from utils.secrets import redact_text
    message = redact_text(" ".join(str(e).split()))
    for h in logging.getLogger().handlers:
        if getattr(h, "_reform_log", False):
            h.emit(logging.LogRecord("run_eval", logging.ERROR, __file__, 0, message, None, None))
    rank = os.environ.get("RANK")
    if getattr(e, "every_rank", False) and rank not in (None, "0"):
        return e.exit_code  # every rank met this input error: rank 0 reports it, once
    prefix = f"error (rank {rank}): " if rank is not None and os.environ.get("WORLD_SIZE", "1") != "1" else "error: "
    sys.stderr.flush()
    print(prefix + message, file=sys.stderr, flush=True)
    error_file = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if error_file:  # torchrun's failure summary then shows this line instead of a traceback hint
        try:
            with open(error_file, "w", encoding="utf-8") as f:
                json.dump({"message": {"message": prefix + message, "extraInfo": {
                    "py_callstack": prefix + message, "timestamp": str(int(time.time()))}}}, f)
        except OSError:
            pass
    return e.exit_code


def cli() -> None:
    """Console-script entry point."""
    sys.exit(main())


if __name__ == "__main__":
    cli()
