"""SingleChoice scoring: likelihood argmax, option-mark parsing, format hit rate, instability.

Mark parsing rule (documented in docs/metrics.md): take the first standalone mark in the
response, written ``(A)`` or ``A)``, or a response that is only a mark (``A``, ``A.``),
whose mark names a valid option (letters compared case-insensitively). Failing that, a
response equal to one option's text after lower-casing and removing punctuation and
surrounding whitespace selects it. Otherwise the response is *unparsed* and counts wrong.
Number marks have any number of digits (``(100)`` names option 100).

Why no pattern here can backtrack: models do emit degenerate text (a mark and 150,000 spaces,
a megabyte of dots), so every step is linear in the response: the lone mark is tested after
``str.strip``, never with adjacent ``\\s*`` runs, and the standalone-mark pattern cannot start
inside a run of letters or digits (its look-behind), so it rescans nothing.
"""
from __future__ import annotations

import hashlib
import json
import math
import re
from collections import Counter, defaultdict
from typing import Any, Dict, List, Optional, Sequence

from . import register_metric
from ..utils.answer_text import normalize_text
from ..utils.errors import ReformError, input_error

UNPARSED = None
_MARK_RE = re.compile(r"(?<![A-Za-z0-9])\(?([A-Za-z]|[0-9]+)\)(?![A-Za-z0-9])")
_LONE_MARK_RE = re.compile(r"\(?([A-Za-z]|[0-9]+)\)?")


def _strip_lone(response: str) -> str:
    """The response without surrounding whitespace and one final ``.`` or ``:`` (what may follow
    a lone mark), in linear time."""
    text = response.strip()
    if text.endswith((".", ":")):
        text = text[:-1].rstrip()
    return text


def parse_choice(response: str, marks: Sequence[str], options: Sequence[str]) -> Optional[int]:
    """Index of the option a generated response names, or None when unparsed."""
    if not isinstance(response, str):
        return UNPARSED
    lookup = {m.lower(): i for i, m in enumerate(marks)}
    lone = _LONE_MARK_RE.fullmatch(_strip_lone(response))
    if lone and lone.group(1).lower() in lookup:
        return lookup[lone.group(1).lower()]
    for m in _MARK_RE.finditer(response):
        key = m.group(1).lower()
        if key in lookup:
            return lookup[key]
    norm = normalize_text(response)
    if norm:
        for i, opt in enumerate(options):
            if normalize_text(opt) == norm:
                return i
    return UNPARSED


def reduce_scores(logprobs: Sequence[float], num_tokens: Sequence[int], reduction: str) -> List[float]:
    """Apply the likelihood reduction: ``sum`` keeps summed log-probs, ``mean`` divides by tokens."""
    if reduction == "sum":
        return [float(x) for x in logprobs]
    if reduction == "mean":
        return [float(x) / max(int(n), 1) for x, n in zip(logprobs, num_tokens)]
    raise ReformError(f"unknown likelihood_reduction '{reduction}'; valid names: mean, sum")


def argmax(values: Sequence[float]) -> int:
    """Index of the largest value; ties go to the first."""
    best = 0
    for i, v in enumerate(values):
        if v > values[best]:
            best = i
    return best


def likelihood_choice(record: Dict[str, Any], reduction: str, where: str = "") -> int:
    """The candidate index picked by reduced likelihood for one record."""
    lp, nt = record.get("candidate_logprobs"), record.get("candidate_num_tokens")
    if lp is None or nt is None:
        pred = record.get("prediction")
        if isinstance(pred, int) and not isinstance(pred, bool):
            return pred
        raise input_error("likelihood record needs 'candidate_logprobs' and 'candidate_num_tokens' "
                          "or an integer 'prediction'", file=where or None, field="prediction")
    return argmax(reduce_scores(lp, nt, reduction))


def check_record(rec: Dict[str, Any], idx: int, fields: Sequence[str], file: Optional[str]) -> None:
    """Raise a clear error if a record lacks a required field."""
    if not isinstance(rec, dict):
        raise input_error("a prediction record must be a JSON object", file=file, record=idx)
    for f in fields:
        if f not in rec:
            raise input_error("missing", file=file, record=idx, field=f)


def answer_text(rec: Dict[str, Any]) -> Optional[str]:
    """The correct answer as text: the record's ``answer_text``, the option an index names, or ``answer``."""
    if rec.get("answer_text") is not None:
        return str(rec["answer_text"])
    ans, opts = rec.get("answer"), rec.get("answer_options")
    if opts and isinstance(ans, int) and not isinstance(ans, bool) and 0 <= ans < len(opts):
        return str(opts[ans])
    return None if ans is None else str(ans)


def record_fields(rec: Dict[str, Any], cluster: Any = None) -> Dict[str, Any]:
    """The fields every per_sample entry starts with, so one table explains each verdict.

    ``cluster`` is the bootstrap unit (default: the sample id, which keeps all duplicates
    of a sample together)."""
    return {"sample_id": rec.get("sample_id"), "dup_index": int(rec.get("dup_index", 0) or 0),
            "cluster": str(rec.get("sample_id") if cluster is None else cluster),
            "question": rec.get("question"), "answer_text": answer_text(rec),
            "prediction": rec.get("prediction")}


def score_single_choice(records: List[Dict[str, Any]], infer_method: str, likelihood_reduction: str = "sum",
                        file: Optional[str] = None) -> List[Dict[str, Any]]:
    """Per-record verdicts: record_fields plus ``{extracted, chosen_text, correct}``."""
    out = []
    for i, rec in enumerate(records):
        check_record(rec, i, ("sample_id", "answer", "prediction", "answer_options"), file)
        options = rec["answer_options"]
        answer = rec["answer"]
        if not isinstance(answer, int) or isinstance(answer, bool) or not 0 <= answer < len(options):
            raise input_error(f"answer must be an option index in 0..{len(options) - 1}, got {answer!r}",
                              file=file, record=i, field="answer")
        if infer_method == "likelihood":
            pred = rec["prediction"]
            if not (isinstance(pred, int) and not isinstance(pred, bool)) and rec.get("candidate_logprobs") is None:
                raise input_error(f"likelihood prediction must be an integer index, got {type(pred).__name__}",
                                  file=file, record=i, field="prediction")
            index = likelihood_choice(rec, likelihood_reduction, file or "")
            if not 0 <= index < len(options):
                raise input_error(f"prediction index {index} out of range for {len(options)} options",
                                  file=file, record=i, field="prediction")
            extracted: Optional[int] = index
        else:
            if not isinstance(rec["prediction"], str):
                raise input_error(f"generation prediction must be a string, got {type(rec['prediction']).__name__}",
                                  file=file, record=i, field="prediction")
            marks = rec.get("option_marks") or [chr(65 + k) for k in range(len(options))]
            extracted = parse_choice(rec["prediction"], marks, options)
        out.append({
            **record_fields(rec),
            "extracted": extracted,
            "chosen_text": options[extracted] if extracted is not None else None,
            "correct": extracted is not None and extracted == answer,
        })
    return out


def instability(per_sample: List[Dict[str, Any]], key: str = "chosen_text") -> float:
    """Mean over samples of the entropy (natural log) of the chosen answer text across duplicates.

    An unparsed response counts as its own outcome (``None``), so a model that sometimes fails
    to answer is unstable too.
    """
    groups: Dict[str, List[Any]] = defaultdict(list)
    for r in per_sample:
        groups[str(r["sample_id"])].append(r[key])
    if not groups:
        return 0.0
    total = 0.0
    for choices in groups.values():
        n = len(choices)
        ent = -sum((c / n) * math.log(c / n) for c in Counter(choices).values())
        total += ent + 0.0
    return total / len(groups)


#: what duplication varies between the copies of a sample: option order and marks, the
#: instruction phrasing, and what the model was shown (a record may lack any of them)
DUPLICATE_VARIED_FIELDS = ("instruct", "answer_options", "option_marks", "question_with_option", "candidates",
                           "question", "history", "prompt")


def stability_problem(records: Sequence[Dict[str, Any]]) -> Optional[str]:
    """Why instability would mislead on these records, or None when it can be measured.

    Instability is the spread of answers across the duplicates of a sample, which differ in
    option order, marks or instruction. With one copy per sample, or copies identical in every
    DUPLICATE_VARIED_FIELDS field (``--shuffle_options false --random_instruct false``), greedy
    decoding answers every copy alike and instability reads 0 by construction."""
    views: Dict[str, set] = defaultdict(set)
    copies: Dict[str, set] = defaultdict(set)
    for r in records:
        sid = str(r.get("sample_id"))
        copies[sid].add(int(r.get("dup_index", 0) or 0))
        shown = json.dumps([r.get(f) for f in DUPLICATE_VARIED_FIELDS], sort_keys=True, default=str)
        views[sid].add(hashlib.blake2b(shown.encode("utf-8", "surrogatepass"), digest_size=16).digest())
    duplicated = [sid for sid, dups in copies.items() if len(dups) > 1]
    if not duplicated:
        return ("--eval_stability needs duplicates of each sample (--dataset_duplication >= 2 at run time); "
                "with one copy instability would read 0")
    if all(len(views[sid]) == 1 for sid in duplicated):
        return ("--eval_stability over identical copies: the duplicates of every sample have the same "
                "instruction, options and marks (made with --shuffle_options false --random_instruct false?), "
                "so instability would read 0 by construction; re-run with shuffled options, random "
                "instructions or --option_mark random")
    return None


def check_stability(records: Sequence[Dict[str, Any]], file: Optional[str] = None) -> None:
    """Refuse ``--eval_stability`` where ``stability_problem`` finds one (one line, naming the file)."""
    problem = stability_problem(records)
    if problem:
        raise ReformError(f"{file or 'records'}: {problem}")


def generated(prediction: Any) -> bool:
    """Whether a generation record holds a response at all (an empty or blank one is none)."""
    if isinstance(prediction, str):
        return bool(prediction.strip())
    if isinstance(prediction, (list, tuple)):  # several responses per sample
        return any(generated(p) for p in prediction)
    return prediction is not None


def format_hit_rate(per_sample: Sequence[Dict[str, Any]]) -> Optional[float]:
    """Share of responses whose answer could be read; None (undefined, shown n/a) when nothing
    was generated: no response can hit or miss a format, and 1.0 or 0.0 would both mislead."""
    if not per_sample or (all("prediction" in r for r in per_sample)
                          and not any(generated(r["prediction"]) for r in per_sample)):
        return None
    return sum(r["extracted"] is not None for r in per_sample) / len(per_sample)


def accuracy_summary(per_sample: List[Dict[str, Any]], infer_method: str, eval_stability: bool) -> Dict[str, Any]:
    """Accuracy, format hit rate (generation) and optional instability."""
    n = len(per_sample)
    summary: Dict[str, Any] = {"num_records": n,
                               "num_samples": len({str(r["sample_id"]) for r in per_sample}),
                               "accuracy": sum(r["correct"] for r in per_sample) / n if n else 0.0}
    if infer_method == "generation":
        summary["format_hit_rate"] = format_hit_rate(per_sample)
    if eval_stability:
        summary["instability"] = instability(per_sample)
    return summary


@register_metric("single_choice")
def single_choice_metric(records: List[Dict[str, Any]], formulation: str = "SingleChoice",
                         infer_method: str = "generation", eval_stability: bool = False,
                         likelihood_reduction: str = "sum", file: Optional[str] = None,
                         **_: Any) -> Dict[str, Any]:
    """Generic SingleChoice metric."""
    if eval_stability:
        check_stability(records, file)
    per_sample = score_single_choice(records, infer_method, likelihood_reduction, file)
    return {"metrics": accuracy_summary(per_sample, infer_method, eval_stability), "per_sample": per_sample}


def score_generation_match(records: List[Dict[str, Any]], infer_method: str, likelihood_reduction: str = "sum",
                           file: Optional[str] = None, vocabulary_key: Optional[str] = None) -> List[Dict[str, Any]]:
    """Per-record verdicts for Generation with a reference answer: normalised exact match.

    Likelihood picks a candidate by reduced score. With ``vocabulary_key`` (a ``meta`` key
    listing the valid answers) a response outside the vocabulary counts as unparsed
    (``extracted`` None), which the format hit rate reports.
    """
    out = []
    for i, rec in enumerate(records):
        check_record(rec, i, ("sample_id", "answer", "prediction"), file)
        index = rec.get("answer_index")  # a choice item's right candidate (checked by validate_records)
        if infer_method == "likelihood":
            check_record(rec, i, ("candidates",), file)
            idx = likelihood_choice(rec, likelihood_reduction, file or "")
            if not 0 <= idx < len(rec["candidates"]):
                raise input_error(f"prediction index {idx} out of range for {len(rec['candidates'])} candidates",
                                  file=file, record=i, field="prediction")
            extracted: Optional[str] = rec["candidates"][idx]
            if index is not None:  # a choice item: the pick is right by its index, never by its text
                norm = normalize_text(extracted or "")
                out.append({**record_fields(rec), "extracted": extracted, "chosen_text": norm, "correct": idx == index})
                continue
        else:
            if not isinstance(rec["prediction"], str):
                raise input_error(f"generation prediction must be a string, got {type(rec['prediction']).__name__}",
                                  file=file, record=i, field="prediction")
            extracted = rec["prediction"] if generated(rec["prediction"]) else None  # no response: no answer read
        norm = normalize_text(extracted or "")
        vocab = {normalize_text(v) for v in rec.get("meta", {}).get(vocabulary_key, [])} if vocabulary_key else set()
        out.append({**record_fields(rec),
                    "extracted": extracted if (not vocab or norm in vocab) else None,
                    "chosen_text": norm,
                    "correct": norm == normalize_text(rec["answer"])})
    return out


@register_metric("exact_match")
def exact_match_metric(records: List[Dict[str, Any]], infer_method: str = "generation",
                       eval_stability: bool = False, likelihood_reduction: str = "sum",
                       file: Optional[str] = None, **_: Any) -> Dict[str, Any]:
    """Generic Generation metric: normalised exact match against ``answer`` (or the chosen candidate)."""
    if eval_stability:
        check_stability(records, file)
    per_sample = score_generation_match(records, infer_method, likelihood_reduction, file)
    return {"metrics": accuracy_summary(per_sample, infer_method, eval_stability), "per_sample": per_sample}
