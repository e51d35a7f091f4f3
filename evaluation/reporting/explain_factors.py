"""The run-level half of an explanation: every recorded fact of a run, by the name a researcher
knows it, and the differences between two runs (``evaluation.reporting.explain`` adds the
per-sample half).

Why a table: a run records the same factor under several keys (``config.model_option.system_msg``
and ``provenance.system_line`` are both the system line; a foreign log writes its parse rule as
``provenance.parse_mode``), and a researcher asks about the factor, not the key. A key the table
does not know is still shown under its own name, so no recorded difference is dropped unseen;
what cannot change an answer (paths, run ids, timings, output and cache folders) is ``IGNORED``.
"""
from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Optional, Tuple

from ...utils.errors import input_error

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
    ("scoring.parse_rule", "parse mode", SETTINGS),
    ("provenance.parse_mode", "parse mode", SETTINGS),
    ("provenance.generation.temperature", "temperature", SETTINGS),
    ("provenance.generation.max_new_tokens", "max new tokens", SETTINGS),
    ("provenance.harness.name", "harness", SETTINGS),
    ("provenance.harness.version", "harness version", SETTINGS),
    ("provenance.harness.chat_template", "chat template", PROMPT),
    ("provenance.harness.pre_prompt", "pre-prompt", PROMPT),
    ("provenance.harness.post_prompt", "post-prompt", PROMPT),
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
    "provenance.prompt_example", "provenance.harness.results_file", "provenance.harness.file",
    "provenance.harness.model_label", "provenance.harness.template_rule", "provenance.harness.layout",
)

#: a setting asked for -> the record of what was applied, compared instead where both runs have it
#: (a foreign log is parsed by its own rule when no --mme_parse is given)
SUPERSEDED = {"scoring.metric_options.mme_parse": "scoring.parse_rule"}

#: one value under two names: our interfaces record the preprocessor's class, a foreign reader
#: (and ``--model_option preprocessor=``) its option name
VALUE_ALIASES: Dict[str, Dict[str, str]] = {
    "provenance.preprocessor": {"ChatTemplateProcessor": "chat_template", "ConvProcessor": "conv"}}

#: pixel factors that change the prompt too (``--image_ablation none`` drops the image placeholders)
ALSO_PROMPT = ("image ablation",)

#: paths that name what answers (a checkpoint folder is the model): compared like any value
PATH_FACTORS = ("config.model_name",)

#: settings that only act on one inference method
GENERATION_ONLY = ("config.temperature", "config.max_new_tokens", "config.model_option.max_new_tokens",
                   "config.num_samples")
LIKELIHOOD_ONLY = ("scoring.likelihood_reduction",)

#: scoring defaults: a run that did not name one was scored with it
SCORING_DEFAULTS = {"scoring.likelihood_reduction": "sum", "scoring.metric_options.mme_parse": "official"}

def _match(key: str, pattern: str) -> bool:
    return key.startswith(pattern[:-1]) if pattern.endswith(".*") else key == pattern


def factor_of(key: str) -> Optional[Tuple[str, str]]:
    """(name, kind) of a recorded key; None for a key that cannot change an answer."""
    if any(_match(key, p) for p in IGNORED):
        return None
    for pattern, name, kind in FACTORS:
        if _match(key, pattern):
            return name, kind
    for prefix in ("versions.", "provenance.versions."):  # the run's and the interface's: one name
        if key.startswith(prefix):
            return f"{key[len(prefix):]} version", SETTINGS
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
    rule = info.get("parse_rule", (info.get("metrics") or {}).get("parse_rule")
                    if isinstance(info.get("metrics"), dict) else None)
    if rule is not None:  # the rule that really parsed the answers (MME: the option, a log's own rule, ...):
        facts["scoring.parse_rule"] = rule  # it, not the option asked for, is compared (run_differences)
    for key, aliases in VALUE_ALIASES.items():
        if isinstance(facts.get(key), str):
            facts[key] = aliases.get(facts[key], facts[key])
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


def shown_value(value: Any, limit: int = 60) -> str:
    if value is None:
        return "(none)"
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
    compared = set()  # factor names some key of which both runs record
    keys = sorted(set(facts_a) | set(facts_b), key=lambda k: (not k.startswith("provenance."), k))
    for key in keys:
        named = factor_of(key)
        if named is None or not _applies(key, methods):
            continue
        if key in SUPERSEDED and SUPERSEDED[key] in facts_a and SUPERSEDED[key] in facts_b:
            continue  # both record what was really applied
        if key.startswith("config.") and key not in PATH_FACTORS and (
                _looks_like_path(facts_a.get(key)) or _looks_like_path(facts_b.get(key))):
            continue  # a path cannot change an answer; what it holds is compared item by item
        name, kind = named
        known_a, va = _value(key, facts_a, rec_a)
        known_b, vb = _value(key, facts_b, rec_b)
        if known_a and known_b:
            compared.add(name)
            if va != vb:
                entry = diffs.setdefault(name, {"factor": name, "kind": kind, "a": shown_value(va), "b": shown_value(vb),
                                                "keys": []})
                entry["keys"].append(key)
        elif known_a != known_b:
            entry = one_sided.setdefault(name, {"factor": name, "kind": kind, "recorded_by": "A" if known_a else "B",
                                                "value": shown_value(va if known_a else vb), "keys": []})
            entry["keys"].append(key)
    for name in compared:
        one_sided.pop(name, None)  # known on both sides under another key: compared there
    return list(diffs.values()), list(one_sided.values())
