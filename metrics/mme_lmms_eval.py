"""lmms-eval's ``--log_samples`` output for its ``mme`` task, read as prediction records and scored
by our MME scorer; its results JSON (beside it) gives the run's settings as provenance.

Why: "my score does not match lmms-eval" is answered by scoring lmms-eval's own log with our
scorer (the same numbers it reported) and pairing its rows with our run, question by question,
with every setting the log tells recorded for ``explain``. lmms-eval is never imported.

What a line of ``<date>_samples_<task>.jsonl`` holds (lmms-eval 0.7.x, ``EvaluationTracker.
save_results_samples``; docs/foreign_logs.md lists what is read): ``doc_id``, ``target`` (Yes/No),
``input`` (the question as the task wrote it, e.g. with "\\nAnswer the question using a single word
or phrase."), ``filtered_resps`` (the response lmms-eval scored), ``resps`` (raw, when they
differ), and the task's metric entry ``mme_perception_score`` / ``mme_cognition_score`` =
``{question_id: "<subtask>/<image file>", category: <subtask>, score: 0|1}``. Older versions also
keep ``doc`` (question_id, question, answer, category) and ``arguments``; both are read.

Rows map to our items by (subtask, image file name, question) (``metrics.mme.item_key``), never by
position. lmms-eval parses answers with its own rule (our ``stripped``), the default here.
"""
from __future__ import annotations

import glob
import hashlib
import json
import os
import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..build.mme import canonical_subtask, normalize_gt
from .mme import check_unique_items, foreign_record
from ..utils.errors import input_error
from ..utils.inputs import first_line, iter_jsonl, read_json
from ..utils.predictions import ForeignRecords, register_foreign_companion, register_foreign_reader
from ..utils.templates import render_templates

HARNESS = "lmms-eval"
METRIC_KEYS = ("mme_perception_score", "mme_cognition_score")
#: lmms-eval's MME answer rule (``parse_pred_ans`` in its tasks/mme/utils.py) is our ``stripped``
PARSE_RULE = "stripped"
#: lmms-eval model names whose model code we read and know to run Hugging Face transformers
#: (lmms_eval/models/{simple,chat}/llava_hf.py); other models' engine stays unknown
TRANSFORMERS_MODELS = ("llava_hf", "llava_hf_chat")
#: where lmms-eval's results JSON holds the chat template (named when a template is refused)
TEMPLATE_FIELD = "config.model_args.chat_template"
_SAMPLES_NAME = re.compile(r"^(?P<date>.+)_samples_(?P<task>.+)\.jsonl$")


def accepts(path: str) -> bool:
    """A ``.jsonl`` whose first record (its whole line, a BOM dropped) has lmms-eval's sample
    fields (``doc_id`` and responses)."""
    if not path.lower().endswith(".jsonl"):
        return False
    try:
        obj = json.loads(first_line(path))
    except ValueError:
        return False
    return isinstance(obj, dict) and "doc_id" in obj and ("filtered_resps" in obj or "resps" in obj)


def _metric_entry(obj: Dict[str, Any], path: str, line: int) -> Tuple[str, Dict[str, Any]]:
    """(field name, {question_id, category, ...}) of the MME metric entry, or the older ``doc``."""
    for key in METRIC_KEYS:
        if key in obj:
            entry = obj[key]
            if not isinstance(entry, dict):
                raise input_error(f"must be an object with question_id and category, got {type(entry).__name__}",
                                  file=path, record=f"line {line}", field=key)
            return key, entry
    doc = obj.get("doc")
    if isinstance(doc, dict) and "question_id" in doc:
        return "doc", doc
    raise input_error(f"has no MME result ({' or '.join(METRIC_KEYS)}); is this the samples file of "
                      "lmms-eval's mme task?", file=path, record=f"line {line}", field=METRIC_KEYS[0])


def _string(value: Any, path: str, line: int, field: str) -> str:
    if isinstance(value, list) and len(value) == 1:  # [response] when not flattened
        value = value[0]
    if not isinstance(value, str):
        raise input_error(f"must be a string, got {type(value).__name__}", file=path, record=f"line {line}",
                          field=field)
    return value


def _question(obj: Dict[str, Any], path: str, line: int) -> str:
    """The question text as lmms-eval asked it: ``input`` (0.7), else ``arguments[0]``, else the doc's."""
    if "input" in obj:
        return _string(obj["input"], path, line, "input")
    args = obj.get("arguments")
    if isinstance(args, list) and args and isinstance(args[0], str):
        return args[0]
    doc = obj.get("doc")
    if isinstance(doc, dict) and isinstance(doc.get("question"), str):
        return doc["question"]
    raise input_error("missing (the question lmms-eval asked)", file=path, record=f"line {line}", field="input")


def results_file(path: str) -> Optional[str]:
    """lmms-eval's results JSON of the same run: ``<date>_results.json`` beside ``<date>_samples_<task>.jsonl``."""
    m = _SAMPLES_NAME.match(os.path.basename(path))
    if not m:
        return None
    cand = os.path.join(os.path.dirname(os.path.abspath(path)), f"{m.group('date')}_results.json")
    return cand if os.path.isfile(cand) else None


def read_lmms_eval_samples(path: str) -> ForeignRecords:
    """lmms-eval's MME samples JSONL -> prediction records (one per line), with the run's
    provenance from its results JSON when it lies beside the samples file."""
    results_path = results_file(path)
    results = read_json(results_path, "lmms-eval results file") if results_path else None
    prov = provenance(results if isinstance(results, dict) else None, results_path)
    harness = prov.get("harness") or {}
    template, model = harness.get("chat_template"), harness.get("model_label")
    pre, post = harness.get("pre_prompt") or "", harness.get("post_prompt") or ""
    records: List[Dict[str, Any]] = []
    for line, obj in iter_jsonl(path, "lmms-eval samples file"):
        if not isinstance(obj, dict):
            raise input_error("a sample line must be a JSON object", file=path, record=f"line {line}")
        key, entry = _metric_entry(obj, path, line)
        raw_cat = entry.get("category")
        sub = canonical_subtask(raw_cat) if isinstance(raw_cat, str) else None
        if sub is None:
            raise input_error(f"{raw_cat!r} is not an MME subtask", file=path, record=f"line {line}",
                              field=f"{key}.category")
        qid = _string(entry.get("question_id"), path, line, f"{key}.question_id")
        image = os.path.basename(qid.split("/", 1)[1] if "/" in qid else qid)
        if not image.strip():
            raise input_error(f"names no image ({qid!r})", file=path, record=f"line {line}",
                              field=f"{key}.question_id")
        target = obj.get("target", (obj.get("doc") or {}).get("answer"))
        gt = normalize_gt(target) if isinstance(target, str) else None
        if gt is None:
            raise input_error(f"must be Yes or No, got {target!r}", file=path, record=f"line {line}", field="target")
        if "filtered_resps" not in obj and "resps" not in obj:
            raise input_error("missing (the response)", file=path, record=f"line {line}", field="filtered_resps")
        field = "filtered_resps" if "filtered_resps" in obj else "resps"
        response = _string(obj[field], path, line, field)
        question = _question(obj, path, line)
        meta: Dict[str, Any] = {"doc_id": obj.get("doc_id"), "question_id": qid}
        if isinstance(entry.get("score"), (int, float)) and not isinstance(entry.get("score"), bool):
            meta["harness_correct"] = bool(entry["score"])  # lmms-eval's own verdict, for cross-checks
        if "resps" in obj and field == "filtered_resps":
            meta["raw_response"] = obj["resps"]
        bare = question[len(pre):] if pre and question.startswith(pre) else question  # the task's own wrapping
        bare = bare[: -len(post)] if post and bare.endswith(post) else bare
        records.append(foreign_record(HARNESS, sub, image, question, gt, response, path, line, model=model,
                                      parse_rule=PARSE_RULE, trace=_trace(obj, question), meta=meta,
                                      key_question=bare))
    if not records:
        raise input_error("holds no samples", file=path)
    if template:  # every row's prompt in one bounded rendering
        for rec, prompt in zip(records, render_prompts(template, [r["question"] for r in records], results_path)):
            rec["trace"].update(prompt_sha=_sha(prompt) if prompt is not None else None, prompt_text=prompt)
    check_unique_items(records, path)
    return ForeignRecords(records, prov)


# -- what the log tells of the run's settings ------------------------------------------------

def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def _split_args(text: str) -> Dict[str, str]:
    """lmms-eval's ``--model_args`` string (``k=v,k=v``; commas inside quotes or braces kept)."""
    parts: List[str] = []
    cur: List[str] = []
    depth = 0
    quote: Optional[str] = None
    for ch in text:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
            continue
        cur.append(ch)
    parts.append("".join(cur))
    return dict(p.split("=", 1) for p in parts if "=" in p)


def model_args(results: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """The run's model arguments (a dict, from a string or a YAML config's mapping)."""
    raw = ((results or {}).get("config") or {}).get("model_args")
    if isinstance(raw, dict):
        return dict(raw)
    return _split_args(raw) if isinstance(raw, str) and raw.strip() else {}


def _user_content(user_text: str) -> str:
    return user_text if "<image>" in user_text else f"<image>\n{user_text}"


def render_prompts(template: str, user_texts: Sequence[str], file: Optional[str] = None) -> List[Optional[str]]:
    """The prompt text llava_hf hands its processor for each user text: the chat template applied
    to one user message ``"<image>\\n" + text`` (lmms-eval 0.7 ``LlavaHf.generate_until``), rendered
    as transformers renders templates, bounded (``utils.templates``: a hostile template in the log
    ``file`` is refused in one line); None where the template does not render."""
    contexts = [{"messages": [{"role": "user", "content": _user_content(t)}], "add_generation_prompt": True}
                for t in user_texts]
    return render_templates(template, contexts, file=file, field=TEMPLATE_FIELD)


def render_prompt(template: str, user_text: str, file: Optional[str] = None) -> Optional[str]:
    """``render_prompts`` of one user text."""
    return render_prompts(template, [user_text], file)[0]


def system_line(template: str, file: Optional[str] = None) -> Optional[str]:
    """The text a chat template puts before the user's turn (its system line; "" when none)."""
    rendered = render_prompt(template, "\x00", file)
    if rendered is None or "\x00" not in rendered:
        return None
    before = rendered.split("<image>", 1)[0]
    role = re.search(r"(USER|User|user)\s*:\s*$", before)
    return (before[: role.start()] if role else before).strip()


def _trace(obj: Dict[str, Any], question: str) -> Dict[str, Any]:
    """The per-row trace in the agreed shape: the user text always, token counts where lmms-eval
    logged them; the exact prompt is filled in where the chat template is known."""
    tokens = None
    counts = obj.get("token_counts")
    if isinstance(counts, list) and counts and isinstance(counts[0], dict):
        tokens = counts[0].get("input_tokens")
    return {"prompt_sha": None, "prompt_text": None,
            "prompt_tokens": tokens if isinstance(tokens, int) else None, "bos": None, "pixel_sha": None,
            "user_text": question}


def _prompt_kwarg(specific: Any, name: str) -> Optional[str]:
    """The task's ``lmms_eval_specific_kwargs.default.<name>`` (what it wraps the question in)."""
    value = (specific.get("default") or {}).get(name) if isinstance(specific, dict) else None
    return value if isinstance(value, str) else None


def _version(text: Any) -> Optional[str]:
    """lmms-eval's ``branch@commit`` version string; None where it says it does not know
    ("unknown@unknown": a pip install, whose package version the log does not hold)."""
    return text if isinstance(text, str) and text.strip() and not text.startswith("unknown@unknown") else None


def _template_rule(model: Optional[str], backend: Optional[str], template: Optional[str],
                   given: Optional[str]) -> Optional[str]:
    """What decided the prompt's template, in words, where the log itself does not hold it."""
    if template:
        return "the chat_template model argument (llava_hf simple class)"
    if model != "llava_hf" or backend is None:
        return None
    if ".chat." in backend:
        return ("the checkpoint's own chat template on one user turn (image, question) without a system message"
                + ("; the chat_template argument is ignored by this class" if given else "") + " (not in the log)")
    return ("the tokenizer's chat template, else lmms-eval's Vicuna template with its system line "
            "(which one is not in the log)")


def provenance(results: Optional[Dict[str, Any]], results_path: Optional[str] = None) -> Dict[str, Any]:
    """The run-level provenance in the agreed shape, from lmms-eval's results JSON: model and
    model arguments, the chat template and the system line it implies where the arguments give
    the template, generation settings, parse rule, versions. Every unknown value is None."""
    res = results or {}
    config = res.get("config") or {}
    args = model_args(results)
    model = config.get("model") if isinstance(config.get("model"), str) else None
    backend = config.get("model_backend") if isinstance(config.get("model_backend"), str) else None
    # llava_hf's chat class (0.7's default) applies the checkpoint's own template to the task's
    # messages and ignores a chat_template argument; only the simple class (--force_simple) uses it
    simple = backend is not None and ".simple." in backend
    given = args.get("chat_template") if isinstance(args.get("chat_template"), str) else None
    template = given if simple else None
    task_cfgs = res.get("configs") or {}
    task = next(iter(task_cfgs), None) if isinstance(task_cfgs, dict) else None
    task_cfg = task_cfgs.get(task) or {} if task else {}
    generation = dict(task_cfg.get("generation_kwargs") or {}) or None
    if generation is not None and isinstance(config.get("gen_kwargs"), dict):
        generation.update(config["gen_kwargs"])  # --gen_kwargs override the task's
    specific = task_cfg.get("lmms_eval_specific_kwargs") or {}
    pretrained = args.get("pretrained")
    label = f"lmms-eval {model or 'model'}:{os.path.basename(str(pretrained).rstrip('/'))}" if pretrained else None
    return {
        "engine": "transformers" if model in TRANSFORMERS_MODELS else None,
        "model_class": None, "dtype": args.get("dtype"), "device": args.get("device") or config.get("device"),
        "attn_implementation": args.get("attn_implementation"),
        "chat_template_sha": _sha(template) if template else None,
        "system_line": system_line(template, results_path) if template else None,
        "preprocessor": "chat_template" if template or (backend and ".chat." in backend) else None,
        "bos_token": None, "adds_bos": None,
        "image_processor": {"class": None, "backend": None, "output_size": None},
        "versions": {"torch": None, "transformers": res.get("transformers_version"), "accelerate": None,
                     "vllm": None},
        "generation": generation, "parse_mode": PARSE_RULE,
        "harness": {"name": HARNESS, "version": _version(res.get("lmms_eval_version")), "model": model,
                    "model_args": args or None, "pretrained": pretrained, "model_label": label,
                    "task": task, "task_version": (res.get("versions") or {}).get(task) if task else None,
                    "pre_prompt": _prompt_kwarg(specific, "pre_prompt"),
                    "post_prompt": _prompt_kwarg(specific, "post_prompt"), "chat_template": template,
                    "results_file": results_path,
                    "backend": backend, "template_rule": _template_rule(model, backend, template, given)},
    }


def is_results_companion(path: str) -> bool:
    """lmms-eval's ``<date>_results.json`` with a ``<date>_samples_*.jsonl`` beside it: part of its
    output, read with the samples (as their provenance), not a prediction file."""
    name = os.path.basename(path)
    if not name.endswith("_results.json"):
        return False
    date = name[: -len("_results.json")]
    return bool(glob.glob(os.path.join(glob.escape(os.path.dirname(os.path.abspath(path))),
                                       glob.escape(date) + "_samples_*.jsonl")))


register_foreign_reader("lmms-eval-mme", accepts, read_lmms_eval_samples)
register_foreign_companion(is_results_companion)
