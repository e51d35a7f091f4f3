"""Why two runs differ: every recorded difference that can change an answer, and which of them
touch each sample whose verdict changed.

Why: "my score does not match the paper / the other harness" nearly always comes down to a few
causes (the system line or template, image resolution and processor, BOS, generation settings,
answer parsing, library versions), and no harness says which one moved which answers (issue 27).

What a *run* is here (what another harness's reader must supply; ``evaluation.reporting.explain_files``
builds it from our files):

* ``name``: a label.
* ``records``: prediction records. Pairing needs ``sample_id`` and ``dup_index``, and where known
  ``item_sha`` / ``sample_sha`` (``compare.sample_shas``); a record without either pairs by the
  question (``question_key``: the benchmark, the right answer, the option texts, ``meta`` and the
  image file names). Each sample's attribution reads ``trace`` (``prompt_sha``: sha256[:16] of
  the exact text or messages JSON the model or server got; ``prompt_tokens``; ``bos``;
  ``pixel_sha``; ``image_sizes``: [width, height] per image as given to the processor), else
  the record's ``prompt_sha`` (the preprocessor's output); a foreign record with neither reads
  as unknown, never as equal.
* ``info``: the run-level record, as our results file holds it: ``config`` (the run's flags,
  ``RunConfig.flags``), ``provenance`` (``interface.provenance()``: engine, dtype, system_line,
  chat_template_sha, adds_bos, image_processor {class, backend, output_size}, endpoint ...),
  ``versions``, ``git_revision``, and the scoring settings that made the verdicts
  (``likelihood_reduction``, ``metric_options`` such as ``mme_parse``). A reader gives the keys
  it knows; a key one run records and the other does not is listed as "recorded by one run
  only", never counted as a difference.
* ``result`` (optional): the scored run (``scoring.score_records``: ``metric``, ``metrics``,
  ``per_sample``). Without it the records are scored here with the ``info``'s settings.

The explanation pairs the runs by item (``compare``'s rule; a pair of the same question asked
another way, e.g. with other option marks or the same images at another resolution, pairs by
``question_key``; never by position), lists every difference of the run-level records (named as
a researcher knows them: ``FACTORS``; paths, run ids, timings and output folders are left out,
``IGNORED``), and for each sample whose verdict changed (right in one run, wrong in the other;
for generation also a changed extracted answer; for PIF a changed per-turn PIF) says which
differences touch it: its prompt (text or tokens differ), its pixels (the image tensor or the
images' sizes differ), or only settings (dtype, parse mode, ...: what acts on every sample).
It ends with one line: "accuracy moved by X: N samples flipped; M of them have different
prompts, K different pixels, J only different settings".
"""
from __future__ import annotations

import json
import os
import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

from evaluation.reporting.bootstrap import family_of
from evaluation.reporting.compare import Key, same_content, sample_shas
from utils.errors import ReformError, input_error
from utils.inputs import read_json

# -- what the recorded keys are called ------------------------------------------------------------

#: kinds of factor: what a difference acts on (a sample's prompt, its pixels, or every sample)
PROMPT, PIXELS, SETTINGS = "prompt", "pixels", "settings"

#: recorded key (dotted, as ``run_facts`` flattens it; a trailing ``.*`` matches every key below)
#: -> (the name a researcher knows, what it acts on). Keys not listed are shown by their own name
#: (acting on every sample), so no recorded difference is ever dropped unseen.
FACTORS: Tuple[Tuple[str, str, str], ...] = (
    ("config.model_option.system_msg", "system line", PROMPT),
    ("provenance.system_line", "system line", PROMPT),
    ("config.model_option.preprocessor", "prompt format", PROMPT),
    ("provenance.preprocessor", "prompt format", PROMPT),
    ("provenance.chat_template_sha", "chat template", PROMPT),
    ("config.model_option.response_prefix", "response prefix", PROMPT),
    ("config.model_option.add_bos", "BOS", PROMPT),
    ("provenance.adds_bos", "BOS", PROMPT),
    ("provenance.bos_token", "BOS", PROMPT),
    ("config.model_option.max_context_tokens", "context limit", PROMPT),
    ("config.option_mark", "option marks", PROMPT),
    ("config.shuffle_options", "option order", PROMPT),
    ("config.random_instruct", "instruction", PROMPT),
    ("config.instructions_at_end", "instruction position", PROMPT),
    ("config.in_context_sample", "in-context examples", PROMPT),
    ("config.history", "history turns", PROMPT),
    ("config.context_policy", "context policy", PROMPT),
    ("config.formulation", "formulation", PROMPT),
    ("config.image_ablation", "image ablation", PIXELS),
    ("build_info.image_ablation.applied", "image ablation", PIXELS),
    ("provenance.image_processor.class", "image processor", PIXELS),
    ("provenance.image_processor.backend", "image processor backend", PIXELS),
    ("provenance.image_processor.output_size.*", "image size", PIXELS),
    ("provenance.image_processor.resample", "image resampling", PIXELS),
    ("provenance.image_format", "image encoding", PIXELS),
    ("config.model_option.dtype", "dtype", SETTINGS),
    ("config.half_evaluation", "dtype", SETTINGS),
    ("provenance.dtype", "dtype", SETTINGS),
    ("provenance.device", "device", SETTINGS),
    ("config.model_option.attn_implementation", "attention implementation", SETTINGS),
    ("provenance.attn_implementation", "attention implementation", SETTINGS),
    ("config.model", "model family", SETTINGS),
    ("config.model_name", "checkpoint", SETTINGS),
    ("config.model_type", "model type", SETTINGS),
    ("config.model_option.tiny_size", "checkpoint", SETTINGS),
    ("provenance.model_class", "model class", SETTINGS),
    ("provenance.engine", "engine", SETTINGS),
    ("config.model_option.base_url", "endpoint", SETTINGS),
    ("provenance.endpoint.url", "endpoint", SETTINGS),
    ("provenance.endpoint.requested_model", "requested model", SETTINGS),
    ("provenance.endpoint.served_model", "served model", SETTINGS),
    ("provenance.endpoint.server_version", "server version", SETTINGS),
    ("provenance.extra_body_keys", "request options", SETTINGS),
    ("config.infer_method", "inference method", SETTINGS),
    ("config.per_gpu_eval_batch_size", "batch size", SETTINGS),
    ("config.temperature", "temperature", SETTINGS),
    ("config.max_new_tokens", "max new tokens", SETTINGS),
    ("config.model_option.max_new_tokens", "max new tokens", SETTINGS),
    ("config.num_samples", "responses per sample", SETTINGS),
    ("config.seed", "seed", SETTINGS),
    ("config.dataset_duplication", "duplication", SETTINGS),
    ("config.dataset_name", "benchmark", SETTINGS),
    ("config.dataset_config", "dataset config", SETTINGS),
    ("scoring.metric_options.mme_parse", "parse mode", SETTINGS),
    ("scoring.metric_options.strip_reasoning", "reasoning stripped before scoring", SETTINGS),
    ("scoring.metric_options.number_words", "number words (PIF checkers)", SETTINGS),
    ("scoring.likelihood_reduction", "likelihood reduction", SETTINGS),
    ("git_revision", "code version", SETTINGS),
)

#: keys that cannot change an answer: where files went, names and ids, timing, bookkeeping, and
#: a sample prompt (each sample's own prompt is compared instead). The scoring flags of the
#: run's command are left out too: the scoring that made the verdicts is ``scoring.*``.
IGNORED: Tuple[str, ...] = (
    "config.output_dir", "config.overwrite", "config.do_eval", "config.eval_stability", "config.export_mme_results",
    "config.log_to", "config.verbose", "config.no_cache", "config.cache_dir", "config.identity_hash",
    "config.num_workers", "config.save_images", "config.skip_corrupt", "config.dataset_subsample",
    "config.likelihood_reduction", "config.metric_option.*",
    "config.model_option.api_key", "config.model_option.timeout", "config.model_option.max_retries",
    "config.model_option.max_concurrency", "config.model_option.backoff_base", "config.model_option.prompt_price",
    "config.model_option.completion_price", "config.model_option.offload_folder", "config.model_option.gpus_per_rank",
    "provenance.prompt_example", "provenance.versions.*",  # (the run's own "versions" are compared)
)

#: pixel factors that change the prompt too (``--image_ablation none`` drops the image placeholders)
ALSO_PROMPT = ("image ablation",)

#: settings that only act on one inference method
GENERATION_ONLY = ("config.temperature", "config.max_new_tokens", "config.model_option.max_new_tokens",
                   "config.num_samples")
LIKELIHOOD_ONLY = ("scoring.likelihood_reduction",)

#: scoring defaults: a run that did not name one was scored with it
SCORING_DEFAULTS = {"scoring.likelihood_reduction": "sum", "scoring.metric_options.mme_parse": "official"}

#: record fields that say how one item was asked (a pair of the same question asked two ways)
ITEM_FIELDS: Tuple[Tuple[str, str, str], ...] = (
    ("option_marks", "option marks", PROMPT), ("answer_options", "option order", PROMPT),
    ("question", "question text", PROMPT), ("instruct", "instruction", PROMPT), ("history", "history turns", PROMPT),
    ("image_ablation", "image ablation", PIXELS))


def _match(key: str, pattern: str) -> bool:
    return key.startswith(pattern[:-1]) if pattern.endswith(".*") else key == pattern


def factor_of(key: str) -> Optional[Tuple[str, str]]:
    """(name, kind) of a recorded key; None for a key that cannot change an answer."""
    if any(_match(key, p) for p in IGNORED):
        return None
    for pattern, name, kind in FACTORS:
        if _match(key, pattern):
            return name, kind
    if key.startswith("versions."):
        return f"{key.split('.', 1)[1]} version", SETTINGS
    for prefix, label in (("config.model_option.", "model option"), ("config.dataset_option.", "dataset option"),
                          ("scoring.metric_options.", "metric option")):
        if key.startswith(prefix):
            return f"{label} {key[len(prefix):]}", SETTINGS
    return key.replace("provenance.", "").replace("config.", "").replace(".", " ").replace("_", " "), SETTINGS


# -- the run-level facts -----------------------------------------------------------------------------

def _flatten(value: Any, prefix: str, out: Dict[str, Any]) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _flatten(v, f"{prefix}.{k}" if prefix else str(k), out)
    else:
        out[prefix] = value


def _options(items: Any, file: str, field: str) -> Dict[str, str]:
    """``["k=v", ...]`` (the config's option lists) -> {k: v}."""
    if items is None:
        return {}
    if not isinstance(items, list) or not all(isinstance(i, str) and "=" in i for i in items):
        raise input_error("must be a list of KEY=VALUE texts", file=file, field=field)
    return dict(i.split("=", 1) for i in items)


def _looks_like_path(value: Any) -> bool:
    return isinstance(value, str) and ("/" in value or os.sep in value or value.endswith((".yaml", ".yml")))


def run_facts(info: Dict[str, Any], source: str = "run") -> Tuple[Dict[str, Any], set]:
    """(every run-level fact of ``info`` as ``{dotted key: value}``, the prefixes the run records).

    ``info`` is a results file (or ``.run.json``, or a foreign reader's dict): ``config``,
    ``provenance``, ``versions``, ``git_revision``, ``build_info``, and the scoring settings
    (``likelihood_reduction``, ``metric_options``) as ``scoring.*``. A block that is absent is
    not recorded (its keys read as unknown); inside a recorded ``config`` an option not given is
    its default."""
    if not isinstance(info, dict):
        raise input_error("run information must be a JSON object", file=source)
    facts: Dict[str, Any] = {}
    recorded = set()
    for block in ("config", "provenance", "versions", "build_info"):
        value = info.get(block)
        if value is None:
            continue
        if not isinstance(value, dict):
            raise input_error(f"must be an object, got {type(value).__name__}", file=source, field=block)
        recorded.add(block)
        if block == "config":
            value = dict(value)
            for name in ("model_option", "dataset_option"):
                opts = _options(value.pop(name, None), source, f"config.{name}")
                for k, v in opts.items():
                    value[f"{name}.{k}"] = v
            value.pop("metric_option", None)
            for k, v in value.items():
                facts[f"config.{k}"] = v
        elif block == "build_info":
            ablation = value.get("image_ablation")
            if isinstance(ablation, dict) and "applied" in ablation:
                facts["build_info.image_ablation.applied"] = ablation["applied"]
        else:
            _flatten(value, block, facts)
    if "git_revision" in info:
        recorded.add("git_revision")
        facts["git_revision"] = info["git_revision"]
    options = info.get("metric_options")
    if options is not None and not isinstance(options, dict):
        raise input_error(f"must be an object, got {type(options).__name__}", file=source, field="metric_options")
    reduction = info.get("likelihood_reduction")
    if reduction is not None and not isinstance(reduction, str):
        raise input_error(f"must be text, got {reduction!r}", file=source, field="likelihood_reduction")
    recorded.add("scoring")  # scored with what it names, else the defaults (as run_loader_eval does)
    facts["scoring.likelihood_reduction"] = reduction or "sum"
    for k, v in (options or {}).items():
        facts[f"scoring.metric_options.{k}"] = v
    return facts, recorded


def _recorded(key: str, recorded: set) -> bool:
    return key.split(".", 1)[0] in recorded


def _value(key: str, facts: Dict[str, Any], recorded: set) -> Tuple[bool, Any]:
    """(known, value): a recorded block's missing option is its default; an unrecorded block's
    key, or a null provenance value, is unknown."""
    if key in facts and facts[key] is not None:
        return True, facts[key]
    if key in SCORING_DEFAULTS:
        return True, SCORING_DEFAULTS[key]
    if key.startswith("config.") and "config" in recorded:
        return True, "(default)" if key.startswith(("config.model_option.", "config.dataset_option.")) else None
    return False, None


def _applies(key: str, methods: set) -> bool:
    if key in GENERATION_ONLY and methods == {"likelihood"}:
        return False
    if key in LIKELIHOOD_ONLY and methods == {"generation"}:
        return False
    return True


def _shown(value: Any, limit: int = 60) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    text = repr(text) if isinstance(value, str) else text
    return text if len(text) <= limit else text[:limit - 3] + "..."


def run_differences(facts_a: Dict[str, Any], rec_a: set, facts_b: Dict[str, Any], rec_b: set,
                    methods: set) -> Tuple[List[Dict[str, Any]], List[Dict[str, Any]]]:
    """(differences, facts recorded by one run only), one entry per factor name: ``{factor,
    kind, a, b, keys}`` (values shown from the first differing key, provenance first: what the
    model really had)."""
    diffs: Dict[str, Dict[str, Any]] = {}
    one_sided: Dict[str, Dict[str, Any]] = {}
    keys = sorted(set(facts_a) | set(facts_b), key=lambda k: (not k.startswith("provenance."), k))
    for key in keys:
        named = factor_of(key)
        if named is None or not _applies(key, methods):
            continue
        if key.startswith("config.") and (_looks_like_path(facts_a.get(key)) or _looks_like_path(facts_b.get(key))):
            continue  # a path cannot change an answer; what it holds is compared item by item
        name, kind = named
        known_a, va = _value(key, facts_a, rec_a)
        known_b, vb = _value(key, facts_b, rec_b)
        if known_a and known_b:
            if va != vb:
                entry = diffs.setdefault(name, {"factor": name, "kind": kind, "a": _shown(va), "b": _shown(vb),
                                                "keys": []})
                entry["keys"].append(key)
        elif known_a != known_b:
            entry = one_sided.setdefault(name, {"factor": name, "kind": kind, "recorded_by": "A" if known_a else "B",
                                                "value": _shown(va if known_a else vb), "keys": []})
            entry["keys"].append(key)
    for name in diffs:
        one_sided.pop(name, None)  # known to differ: no need to say one run left a part unrecorded
    return list(diffs.values()), list(one_sided.values())


# -- pairing -------------------------------------------------------------------------------------------

def _key(r: Dict[str, Any]) -> Key:
    return (str(r.get("sample_id")), int(r.get("dup_index", 0) or 0))


def _image_name(image_id: Any) -> str:
    text = str(image_id)
    return os.path.basename(text) if ("/" in text or os.sep in text) else text


def question_key(rec: Dict[str, Any]) -> str:
    """What a question is, without how it was asked: the benchmark, the right answer (as text),
    the option texts as a set, ``meta`` and the image file names (not their folder or pixels).
    Two records of one key with other content (``item_sha``) pair when this agrees: the same
    question with other option marks, or the same images at another resolution."""
    answer = rec.get("answer_text")
    if answer is None:
        opts, ans = rec.get("answer_options"), rec.get("answer")
        answer = opts[ans] if isinstance(opts, list) and isinstance(ans, int) and 0 <= ans < len(opts) else ans
    meta = {k: v for k, v in (rec.get("meta") or {}).items() if k != "image_ablation"} \
        if isinstance(rec.get("meta"), dict) else rec.get("meta")
    body = {"benchmark": rec.get("benchmark"), "answer": answer,
            "options": sorted(map(str, rec.get("answer_options") or [])), "meta": meta,
            "images": [_image_name(i) for i in rec.get("image_ids") or []]}
    return json.dumps(body, sort_keys=True, default=str)


def pair_records(a: Dict[str, Any], b: Dict[str, Any]) -> Tuple[List[Tuple[Key, str]], List[Key]]:
    """([(key, how)], keys refused) over the keys both runs scored: ``how`` is ``item`` (compare's
    rule: the same item content) or ``question`` (the same question asked another way,
    ``question_key``); a shared key whose question differs is refused."""
    ra = {_key(r): r for r in a["records"]}
    rb = {_key(r): r for r in b["records"]}
    sa, sb = sample_shas(a), sample_shas(b)
    pairs, refused = [], []
    for k in sorted(set(ra) & set(rb)):
        if same_content(sa.get(k), sb.get(k)):
            pairs.append((k, "item"))
        elif question_key(ra[k]) == question_key(rb[k]):
            pairs.append((k, "question"))
        else:
            refused.append(k)
    return pairs, refused


# -- one pair of samples --------------------------------------------------------------------------------

def _trace(r: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    t = r.get("trace")
    return t if isinstance(t, dict) else None


def prompt_differs(ra: Dict[str, Any], rb: Dict[str, Any]) -> Optional[bool]:
    """Did the model get another prompt: the rendered text (trace ``prompt_sha``) or its tokens
    (``bos``, ``prompt_tokens``); without a trace on both, the preprocessor's output (the
    record's ``prompt_sha``); None when neither is known for both."""
    ta, tb = _trace(ra), _trace(rb)
    if ta and tb and ta.get("prompt_sha") and tb.get("prompt_sha"):
        return any(ta.get(f) != tb.get(f) for f in ("prompt_sha", "bos", "prompt_tokens"))
    if ra.get("prompt_sha") and rb.get("prompt_sha"):
        return ra["prompt_sha"] != rb["prompt_sha"]
    return None


def pixels_differ(ra: Dict[str, Any], rb: Dict[str, Any]) -> Optional[bool]:
    """Did the model get other pixels: the pixel tensor's hash or the images' sizes (trace);
    None without a trace on both."""
    ta, tb = _trace(ra), _trace(rb)
    if not (ta and tb) or "pixel_sha" not in ta or "pixel_sha" not in tb:
        return None
    if ta.get("pixel_sha") != tb.get("pixel_sha"):
        return True
    return bool(ta.get("image_sizes") and tb.get("image_sizes") and ta["image_sizes"] != tb["image_sizes"])


def item_differences(ra: Dict[str, Any], rb: Dict[str, Any], how: str) -> List[Tuple[str, str]]:
    """(factor, kind) of the ways the two records ask one question differently (pairs by
    ``question`` only): option marks, option order, question text, instruction, history, images."""
    if how != "question":
        return []
    out = []
    for field, name, kind in ITEM_FIELDS:
        if ra.get(field) != rb.get(field):
            out.append((name, kind))
    if not out and ra.get("question_with_option") != rb.get("question_with_option"):
        out.append(("question text", PROMPT))
    ta, tb = _trace(ra), _trace(rb)
    sizes_a, sizes_b = (ta or {}).get("image_sizes"), (tb or {}).get("image_sizes")
    if sizes_a and sizes_b and sizes_a != sizes_b:
        out.append(("image size", PIXELS))
    elif not out:  # same question, same asking: what is left of the item is its images' content
        out.append(("image content", PIXELS))
    return out


# -- verdicts -----------------------------------------------------------------------------------------

def _verdicts(result: Dict[str, Any]) -> Dict[Key, Dict[str, Any]]:
    return {_key(p): p for p in result.get("per_sample") or []}


def _answer(p: Dict[str, Any]) -> Any:
    for f in ("chosen_text", "parsed", "extracted"):
        if p.get(f) is not None:
            return p[f]
    return None


def _changed(pa: Dict[str, Any], pb: Dict[str, Any], family: str, generation: bool) -> bool:
    if family == "pif":
        return pa.get("pif") != pb.get("pif") or pa.get("followed") != pb.get("followed")
    if bool(pa.get("correct")) != bool(pb.get("correct")):
        return True
    return generation and _answer(pa) != _answer(pb)


def _verdict_text(p: Dict[str, Any], family: str) -> str:
    if family == "pif":
        return f"pif {float(p.get('pif') or 0.0):.2f}"
    return "right" if p.get("correct") else "wrong"


# -- the explanation -----------------------------------------------------------------------------------

def _methods(run: Dict[str, Any]) -> set:
    return {str(r.get("inference_method")) for r in run["records"] if r.get("inference_method")}


def explain_runs(a: Dict[str, Any], b: Dict[str, Any], info_a: Optional[Dict[str, Any]] = None,
                 info_b: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """The explanation of B against A, as data (JSON-ready); ``format_explanation`` writes it.

    ``a``/``b``: runs ``{"name", "records", "result"}`` (``result`` scored: ``metric``,
    ``metrics``, ``per_sample``); ``info_*``: their run-level records (default: ``info_of``)."""
    for run in (a, b):
        if not (run.get("result") or {}).get("per_sample"):
            raise ReformError(f"run '{run.get('name')}': no scored samples to explain")
    metric_a, metric_b = a["result"].get("metric"), b["result"].get("metric")
    if metric_a != metric_b:
        raise ReformError(f"explain: the runs were scored by different metrics ({metric_a!r}, {metric_b!r}); "
                          "explain two runs of one benchmark")
    family = family_of(metric_a)
    fa, reca = run_facts(info_a if info_a is not None else info_of(a), str(a.get("source") or a["name"]))
    fb, recb = run_facts(info_b if info_b is not None else info_of(b), str(b.get("source") or b["name"]))
    methods = _methods(a) | _methods(b)
    diffs, one_sided = run_differences(fa, reca, fb, recb, methods)
    pairs, refused = pair_records(a, b)
    ra, rb = {_key(r): r for r in a["records"]}, {_key(r): r for r in b["records"]}
    va, vb = _verdicts(a["result"]), _verdicts(b["result"])
    generation = "generation" in methods
    field = "pif" if family == "pif" else "correct"
    by_kind = {kind: [d["factor"] for d in diffs if d["kind"] == kind or (kind == PROMPT and d["factor"] in ALSO_PROMPT)]
               for kind in (PROMPT, PIXELS, SETTINGS)}
    item_factors: Dict[str, Dict[str, Any]] = {}
    flips: List[Dict[str, Any]] = []
    sums = [0.0, 0.0]
    n = 0
    for key, how in pairs:
        if key not in va or key not in vb:
            continue
        n += 1
        pa, pb = va[key], vb[key]
        sums[0] += float(pa.get(field) or 0.0)
        sums[1] += float(pb.get(field) or 0.0)
        items = item_differences(ra[key], rb[key], how)
        for name, kind in items:
            item_factors.setdefault(name, {"factor": name, "kind": kind, "samples": 0})["samples"] += 1
        if not _changed(pa, pb, family, generation):
            continue
        prompt, pixels = prompt_differs(ra[key], rb[key]), pixels_differ(ra[key], rb[key])
        if any(kind == PIXELS for _, kind in items):
            pixels = True
        if any(kind == PROMPT for _, kind in items) and prompt is None:
            prompt = True
        touching: List[str] = []
        if prompt:
            named = by_kind[PROMPT] + [nm for nm, kind in items if kind == PROMPT and nm not in by_kind[PROMPT]]
            touching += named or ["prompt (its cause is not recorded)"]
        if pixels:
            named = by_kind[PIXELS] + [nm for nm, kind in items if kind == PIXELS and nm not in by_kind[PIXELS]]
            touching += named or ["pixels (their cause is not recorded)"]
        touching += by_kind[SETTINGS]
        flips.append({"sample_id": key[0], "dup_index": key[1], "paired_by": how,
                      "a": _verdict_text(pa, family), "b": _verdict_text(pb, family),
                      "answer_a": _answer(pa), "answer_b": _answer(pb),
                      "prompt_differs": prompt, "pixels_differ": pixels, "touched_by": touching})
    for name, entry in item_factors.items():  # the ways items were asked differently join the run's factors
        if not any(d["factor"] == name for d in diffs):
            diffs.append({"factor": name, "kind": entry["kind"], "a": "-", "b": "-",
                          "keys": [f"records ({entry['samples']} paired items)"]})
        else:
            next(d for d in diffs if d["factor"] == name)["keys"].append(f"records ({entry['samples']} paired items)")
    moved = (sums[1] - sums[0]) / n if n else 0.0
    counts = {"prompt": sum(1 for f in flips if f["prompt_differs"]),
              "pixels": sum(1 for f in flips if f["pixels_differ"]),
              "settings": sum(1 for f in flips if f["prompt_differs"] is False and f["pixels_differ"] is False),
              "unknown": sum(1 for f in flips if not f["prompt_differs"] and not f["pixels_differ"]
                             and (f["prompt_differs"] is None or f["pixels_differ"] is None))}
    stat = "pif" if family == "pif" else "accuracy"
    lead = f"{stat} moved by {moved:+.4f}"
    score_moved = None
    if family == "mme":
        ta, tb = (a["result"].get("metrics") or {}).get("total_score"), (b["result"].get("metrics") or {}).get("total_score")
        if isinstance(ta, (int, float)) and isinstance(tb, (int, float)):
            score_moved = float(tb) - float(ta)
            lead += f" and the MME score by {score_moved:+.1f}"
    summary = (f"{lead}: {len(flips)} samples flipped; {counts['prompt']} of them have different prompts, "
               f"{counts['pixels']} different pixels, {counts['settings']} only different settings")
    if counts["unknown"]:
        summary += f", {counts['unknown']} unknown (no trace or prompt hash to tell)"
    flips.sort(key=lambda f: (f["sample_id"], f["dup_index"]))
    return {"a": {"name": a["name"], "prediction_file": a["result"].get("prediction_file")},
            "b": {"name": b["name"], "prediction_file": b["result"].get("prediction_file")},
            "family": family, "statistic": stat, "n_pairs": n,
            "paired_by_item": sum(1 for _, how in pairs if how == "item"),
            "paired_by_question": sum(1 for _, how in pairs if how == "question"),
            "refused": len(refused), "only_a": len(set(ra) - set(rb)), "only_b": len(set(rb) - set(ra)),
            "differences": diffs, "recorded_by_one_run": one_sided, "no_difference": not diffs and not flips,
            "moved": moved, "score_moved": score_moved, "flips": flips, "counts": counts, "summary": summary}


# -- text ---------------------------------------------------------------------------------------------

#: what each kind of factor acts on, in words
KIND_TEXT = {PROMPT: "each sample's prompt", PIXELS: "each sample's pixels", SETTINGS: "every sample"}


def explanation_tables(exp: Dict[str, Any], max_rows: int = 200) -> List[Tuple[str, List[str], List[List[str]]]]:
    """(title, header, rows) of the differences and the changed samples (at most ``max_rows``)."""
    out = []
    rows = [[d["factor"], d["a"], d["b"], KIND_TEXT[d["kind"]], ", ".join(d["keys"])] for d in exp["differences"]]
    rows += [[d["factor"], d["value"] if d["recorded_by"] == "A" else "(not recorded)",
              d["value"] if d["recorded_by"] == "B" else "(not recorded)", KIND_TEXT[d["kind"]],
              ", ".join(d["keys"])] for d in exp["recorded_by_one_run"]]
    out.append((f"Explanation: differences between A ({exp['a']['name']}) and B ({exp['b']['name']})",
                ["factor", "A", "B", "acts on", "recorded as"], rows or [["none", "-", "-", "-", "-"]]))
    if exp["flips"]:
        flips = exp["flips"][:max_rows]
        title = f"Explanation: samples whose verdict changed ({len(exp['flips'])}" + (
            f", first {max_rows} shown)" if len(exp["flips"]) > max_rows else ")")
        out.append((title, ["sample", "A", "B", "A answer", "B answer", "differences touching it"],
                    [[f"{f['sample_id']}" + (f" #{f['dup_index']}" if f["dup_index"] else ""), f["a"], f["b"],
                      _shown(f["answer_a"], 40), _shown(f["answer_b"], 40), ", ".join(f["touched_by"]) or "none recorded"]
                     for f in flips]))
    return out


def explanation_notes(exp: Dict[str, Any]) -> List[str]:
    """The pairing in one sentence, "no difference" when so, and the summary line (last)."""
    notes = [f"Paired {exp['n_pairs']} samples by item ({exp['paired_by_item']} of the same content, "
             f"{exp['paired_by_question']} of the same question asked another way); "
             f"{exp['refused']} shared ids hold other questions and {exp['only_a'] + exp['only_b']} samples are "
             "in one run only (not compared)."]
    if exp["no_difference"]:
        notes.append("no difference: the runs agree on every setting both record, and no verdict changed.")
    elif not exp["differences"]:
        notes.append("no recorded difference: the changed verdicts are not explained by anything recorded "
                     "(nondeterminism, or something neither run records).")
    return notes + [exp["summary"]]


def _path(path: Optional[str]) -> str:
    """A file as the reader typed it: relative to the working folder when it lies below it."""
    if not path:
        return "-"
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


def format_explanation(exp: Dict[str, Any], max_rows: int = 50) -> str:
    """The explanation as console text, ending with the summary line."""
    lines = ["explain B against A"] + [f"  {x}: {exp[x.lower()]['name']} ({_path(exp[x.lower()]['prediction_file'])})"
                                       for x in ("A", "B")] + [""]
    for title, header, rows in explanation_tables(exp, max_rows):
        lines.append(title)
        widths = [max(len(str(h)), *(len(str(r[i])) for r in rows)) for i, h in enumerate(header)]
        for row in [header] + rows:
            lines.append("  " + "  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip())
        lines.append("")
    notes = explanation_notes(exp)
    return "\n".join(lines + notes[:-1] + ([""] if notes[:-1] else []) + notes[-1:])


# -- the run-level record of a prediction file --------------------------------------------------------

#: the scoring settings a scored result records (what made its verdicts)
SCORING_FIELDS = ("likelihood_reduction", "metric_options")


def info_of(run: Dict[str, Any]) -> Dict[str, Any]:
    """A run's run-level record: its ``info`` when given, else its result when that holds the
    run's record (``run_eval --do_eval``), else the run's own results or run file beside its
    prediction file; the scoring settings always from the result that made the verdicts."""
    result = run.get("result") or {}
    info = run.get("info")
    if info is None:
        info = result if (result.get("provenance") is not None or result.get("config") is not None) \
            else recorded_info(result.get("prediction_file"))[0]
    return {**info, **{k: result[k] for k in SCORING_FIELDS if k in result}}


#: results and run files whose run-level record a comparison's runs are explained with
_RUN_FILES = (".results.json", ".run.json")


def recorded_info(prediction_file: Optional[str]) -> Tuple[Dict[str, Any], Optional[str]]:
    """(the run's own record, its file): ``<stem>.results.json`` or ``<stem>.run.json`` beside the
    prediction file, as ``run_eval`` wrote it; ({}, None) when there is none."""
    if not prediction_file:
        return {}, None
    directory, base = os.path.split(os.path.abspath(prediction_file))
    stem = re.sub(r"\.(jsonl|json|csv)$", "", base)
    for suffix in _RUN_FILES:
        path = os.path.join(directory, stem + suffix)
        if os.path.isfile(path):
            info = read_json(path, "results file")
            if not isinstance(info, dict):
                raise input_error("must be a JSON object", file=path)
            if info.get("provenance") is not None or info.get("config") is not None:
                return info, path
    return {}, None
