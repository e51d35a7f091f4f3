"""MME scoring, identical to the official eval tool, plus its results-folder format.

Why a dedicated metric: MME's score is per image pair (acc+) and per subtask sums, and the
answer parsing rule decides results, so the rule is explicit, selectable and recorded.

Parse rules (``mme_parse``):
  official  lower-case; "yes"/"no" as is; else the first 4 characters: "yes" in them -> yes,
            else "no" in them -> no, else other ("not sure" -> no, "The answer is yes" -> other)
  stripped  lmms-eval's ``parse_pred_ans``: lower-case, strip whitespace, remove every '.', a
            lone y/n maps to yes/no, then as official
  vlmevalkit  VLMEvalKit's ``YOrN_Extraction`` with every quirk of its punctuation step (see
            ``parse_vlmevalkit``): the whitespace-separated words, yes without no -> yes, no
            without yes -> no, else other
  word      the runs of letters a-z of the response: yes without no -> yes, no without yes -> no,
            else other
"other" always counts wrong. SingleChoice generation uses the option-mark parser of
metrics.single_choice; likelihood picks the best candidate.

Duplicates (``dup_index``) are scored as independent runs: acc over every record and acc+
over every (image, dup) pair, i.e. the mean of the per-duplicate figures.
"""
from __future__ import annotations

import hashlib
import io
import logging
import os
import re
from collections import OrderedDict, defaultdict
from typing import Any, Callable, Dict, List, Optional, Tuple

from ..build.mme import (COGNITION, LMMS_EVAL_SUFFIX, OFFICIAL_COUNTS, OFFICIAL_SUFFIX, PERCEPTION, SUBTASKS,
                       canonical_subtask, category_of, normalize_gt)
from . import ReportSpec, coverage_note, register_metric, register_option_choices, register_report
from .single_choice import (check_record, check_stability, instability, likelihood_choice, record_fields,
                                   score_single_choice)
from ..utils.errors import ReformError, input_error
from ..utils.inputs import list_dir, read_text
from ..utils.predictions import register_prediction_dir_reader, register_results_exporter
from ..utils.report import markdown_table

logger = logging.getLogger(__name__)

PARSE_RULES = ("official", "stripped", "vlmevalkit", "word")
_WORD_RE = re.compile(r"[a-z]+")
#: the marks VLMEvalKit's ``process_punctuation`` removes; every other character (':', '*', "'",
#: '#', curly and CJK quotes and punctuation, ...) stays glued to its word
_VLMEVALKIT_MARKS = ';/[]"{}()=+\\_-><@`,?!'
_DIGIT_COMMA = re.compile(r"(\d)(,)(\d)")
_LONE_PERIOD = re.compile(r"(?<!\d)\.(?!\d)")
#: VLMEvalKit passes ``re.UNICODE`` (32) where ``Pattern.sub`` takes its count: only the first 32
#: lone periods are removed
_VLMEVALKIT_PERIODS = 32


def parse_official(response: str) -> str:
    """The official eval tool's rule (calculation.py ``parse_pred_ans``)."""
    r = str(response).lower()
    if r in ("yes", "no"):
        return r
    prefix = r[:4]
    if "yes" in prefix:
        return "yes"
    if "no" in prefix:
        return "no"
    return "other"


def parse_stripped(response: str) -> str:
    """lmms-eval's variant: strip whitespace and dots first, and accept a lone y/n."""
    r = str(response).lower().strip().replace(".", "")
    if r in ("yes", "no"):
        return r
    if len(r) == 1:
        return {"y": "yes", "n": "no"}.get(r, "other")
    return parse_official(r)


def parse_vlmevalkit(response: str) -> str:
    """VLMEvalKit's exact-matching rule (``YOrN_Extraction`` after ``process_punctuation``), quirks
    included, so its files score as VLMEvalKit scores them:

    * lower-case; a mark of ``_VLMEVALKIT_MARKS`` is deleted everywhere when the response holds it
      next to a space (``"x, y"``) or holds a comma between digits anywhere (``1,000``), else
      replaced by a space everywhere (so ``"sure,yes, it is"`` gives the word ``sureyes``);
    * other characters are not punctuation to it: ``**yes**``, ``'yes'``, ``yes:``, ``yes。``, ``no1``
      are words of their own;
    * a period not next to a digit is deleted, the first 32 only;
    * the words are the whitespace-separated pieces (Python's ``str.split``)."""
    text = str(response).lower()
    delete = _DIGIT_COMMA.search(text) is not None
    table = {ord(m): "" if delete or f"{m} " in text or f" {m}" in text else " " for m in _VLMEVALKIT_MARKS}
    return _yes_or_no(_LONE_PERIOD.sub("", text.translate(table), count=_VLMEVALKIT_PERIODS).split())


def _yes_or_no(words: Any) -> str:
    """yes without no -> yes, no without yes -> no, else other (both rules' last step)."""
    has_yes, has_no = "yes" in words, "no" in words
    if has_yes and not has_no:
        return "yes"
    if has_no and not has_yes:
        return "no"
    return "other"


def parse_word(response: str) -> str:
    """Word-level: yes without no -> yes, no without yes -> no, else other."""
    return _yes_or_no(set(_WORD_RE.findall(str(response).lower())))


PARSERS: Dict[str, Callable[[str], str]] = {"official": parse_official, "stripped": parse_stripped,
                                            "vlmevalkit": parse_vlmevalkit, "word": parse_word}


def get_parser(rule: str) -> Callable[[str], str]:
    if rule not in PARSERS:
        raise ReformError(f"unknown MME parse rule '{rule}'; valid names: {', '.join(PARSE_RULES)}")
    return PARSERS[rule]


# -- item identity across harnesses ----------------------------------------------------------

#: what harnesses append to MME's question (lmms-eval's ``post_prompt`` variants); removed before
#: matching, so a row asked with another suffix is still the same item
TOOL_SUFFIXES = (LMMS_EVAL_SUFFIX, "\nAnswer the question with Yes or No.", " Answer this question briefly", " Answer:")
_OFFICIAL_TAIL = re.compile(r"\s*please answer yes or no\.?\s*$", re.IGNORECASE)


def question_key(question: str) -> str:
    """The question as an identity: without the official request (" Please answer yes or no.",
    removed anywhere, as lmms-eval does) or a harness's suffix, whitespace runs made one space.

    Why not lower-case or strip punctuation: MME's two questions of an image can differ in one
    word only, and nothing a harness does changes case or punctuation inside the question."""
    text = str(question).replace(OFFICIAL_SUFFIX, " ").strip()
    changed = True
    while changed:  # a suffix may follow another ("... Please answer yes or no. Answer:")
        changed = False
        for suffix in TOOL_SUFFIXES:
            if text.endswith(suffix):
                text, changed = text[: -len(suffix)].rstrip(), True
        stripped = _OFFICIAL_TAIL.sub("", text)
        if stripped != text:
            text, changed = stripped, True
    return " ".join(text.split())


def item_key(subtask: str, image: str, question: str) -> str:
    """The pairing key of one MME question in any harness's output: subtask, image file name and
    ``question_key``. Our records and other harnesses' rows both have it (``item_sha`` cannot be
    shared: it hashes our whole sample), so compare pairs them on it."""
    blob = "\0".join((str(subtask), os.path.basename(str(image).strip()), question_key(question)))
    return "mme:" + hashlib.sha256(blob.encode("utf-8")).hexdigest()[:16]


def record_item_key(rec: Dict[str, Any], subtask: str, image: str) -> str:
    """``item_key`` of a record: from its official question (our records), else its question."""
    meta = rec.get("meta") or {}
    return item_key(subtask, image, meta.get("official_question") or rec.get("question") or "")


def records_parse_rule(records: List[Dict[str, Any]]) -> Optional[str]:
    """The answer rule the records' own harness scored them with (``mme_parse`` on every record
    of another harness's log), or None: such a log is scored by default as its tool scored it."""
    rules = {r.get("mme_parse") for r in records}
    return rules.pop() if len(rules) == 1 and None not in rules else None


# -- per-record verdicts -------------------------------------------------------------------

def _record_key(rec: Dict[str, Any], idx: int, file: Optional[str]) -> Tuple[str, str]:
    meta = rec.get("meta") or {}
    sub, image = meta.get("subtask"), meta.get("image")
    if sub is None or image is None:
        parts = str(rec.get("sample_id", "")).split("/")
        if len(parts) >= 3:
            sub, image = sub or parts[0], image or "/".join(parts[1:-1])
    sub_c = canonical_subtask(sub) if sub is not None else None
    if sub_c is None or image is None:
        raise input_error("MME record needs meta.subtask and meta.image (or a '<subtask>/<image>/<k>' "
                          "sample_id)", file=file, record=idx, field="meta")
    return sub_c, str(image)


def _gt(rec: Dict[str, Any], idx: int, file: Optional[str]) -> str:
    ans = rec["answer"]
    if rec.get("formulation") == "SingleChoice" or (isinstance(ans, int) and not isinstance(ans, bool)):
        opts = rec.get("answer_options") or ["Yes", "No"]
        if not isinstance(ans, int) or not 0 <= ans < len(opts):
            raise input_error(f"answer must be an option index, got {ans!r}", file=file, record=idx, field="answer")
        ans = opts[ans]
    gt = normalize_gt(ans)
    if gt is None:
        raise input_error(f"answer must be Yes or No, got {ans!r}", file=file, record=idx, field="answer")
    return gt.lower()


def parse_records(records: List[Dict[str, Any]], formulation: str, infer_method: str, rule: str = "official",
                  likelihood_reduction: str = "sum", file: Optional[str] = None) -> List[Dict[str, Any]]:
    """Per-record verdicts: record_fields (cluster = the image, so both questions stay together)
    plus {extracted, subtask, category, image, question_index, gt, parsed, correct}."""
    parser = get_parser(rule)
    sc = None
    if formulation == "SingleChoice":
        sc = score_single_choice(records, infer_method, likelihood_reduction, file)
    out = []
    for i, rec in enumerate(records):
        check_record(rec, i, ("sample_id", "answer", "prediction"), file)
        sub, image = _record_key(rec, i, file)
        gt = _gt(rec, i, file)
        if sc is not None:
            chosen = sc[i]["chosen_text"]
            gt_chosen = normalize_gt(chosen) if chosen is not None else None
            parsed = gt_chosen.lower() if gt_chosen else "other"
            extracted: Any = sc[i]["extracted"]
        elif infer_method == "likelihood":
            cands = rec.get("candidates") or ["Yes", "No"]
            extracted = likelihood_choice(rec, likelihood_reduction, file or "")
            if not 0 <= extracted < len(cands):
                raise input_error(f"prediction index {extracted} out of range for {len(cands)} candidates",
                                  file=file, record=i, field="prediction")
            parsed = (normalize_gt(cands[extracted]) or "other").lower()
        else:
            pred = rec["prediction"]
            if not isinstance(pred, str):
                raise input_error(f"generation prediction must be a string, got {type(pred).__name__}",
                                  file=file, record=i, field="prediction")
            parsed = parser(pred)
            extracted = parsed
        meta = rec.get("meta") or {}
        out.append({**record_fields(rec, cluster=f"{sub}/{image}"), "extracted": extracted,
                    "item_key": rec.get("item_key") or record_item_key(rec, sub, image),
                    "subtask": sub, "category": category_of(sub), "image": image,
                    "question_index": meta.get("question_index"), "gt": gt, "parsed": parsed,
                    "correct": parsed == gt})
    return out


# -- aggregation ---------------------------------------------------------------------------

def subtask_metrics(verdicts: List[Dict[str, Any]]) -> Dict[str, Any]:
    """acc, acc+, score and the official extras for one subtask's verdicts."""
    n = len(verdicts)
    correct = sum(v["correct"] for v in verdicts)
    pairs: Dict[Tuple[str, int], List[bool]] = defaultdict(list)
    for v in verdicts:
        pairs[(v["image"], v["dup_index"])].append(v["correct"])
    complete = {k: c for k, c in pairs.items() if len(c) == 2}
    tp = sum(v["gt"] == "yes" and v["parsed"] == "yes" for v in verdicts)
    fn = sum(v["gt"] == "yes" and v["parsed"] == "no" for v in verdicts)
    tn = sum(v["gt"] == "no" and v["parsed"] == "no" for v in verdicts)
    fp = sum(v["gt"] == "no" and v["parsed"] == "yes" for v in verdicts)
    other = sum(v["parsed"] == "other" for v in verdicts)
    acc = correct / n if n else 0.0
    acc_plus = sum(all(c) for c in complete.values()) / len(complete) if complete else 0.0
    sub = verdicts[0]["subtask"] if verdicts else None
    return {
        "acc": acc, "acc_plus": acc_plus, "score": acc * 100 + acc_plus * 100,
        "num_questions": n, "num_images": len(complete), "num_incomplete_images": len(pairs) - len(complete),
        "expected_questions": OFFICIAL_COUNTS.get(sub) if sub else None,
        "TP": tp, "FN": fn, "TN": tn, "FP": fp,
        "precision": tp / (tp + fp) if tp + fp else 0.0,
        "recall": tp / (tp + fn) if tp + fn else 0.0,
        "other_num": other,
    }


def aggregate(verdicts: List[Dict[str, Any]], rule: str) -> Dict[str, Any]:
    """The results' ``metrics`` block: per subtask and the perception/cognition totals."""
    by_sub: Dict[str, List[Dict[str, Any]]] = defaultdict(list)
    for v in verdicts:
        by_sub[v["subtask"]].append(v)
    subtasks = OrderedDict((s, subtask_metrics(by_sub[s])) for s in SUBTASKS if s in by_sub)
    for s, m in subtasks.items():
        m["category"] = category_of(s)
    n = len(verdicts)
    out: Dict[str, Any] = {
        "parse_rule": rule,
        "num_records": n,
        "num_samples": len({str(v["sample_id"]) for v in verdicts}),
        "accuracy": sum(v["correct"] for v in verdicts) / n if n else 0.0,
        "subtasks": subtasks,
        "perception_score": sum(m["score"] for s, m in subtasks.items() if s in PERCEPTION),
        "cognition_score": sum(m["score"] for s, m in subtasks.items() if s in COGNITION),
        "other_num": sum(v["parsed"] == "other" for v in verdicts),
        "subtasks_missing": [s for s in SUBTASKS if s not in subtasks],
        "subtasks_incomplete": [s for s, m in subtasks.items() if m["num_questions"] != OFFICIAL_COUNTS[s]],
    }
    out["total_score"] = out["perception_score"] + out["cognition_score"]
    incomplete = sum(m["num_incomplete_images"] for m in subtasks.values())
    if incomplete:
        logger.warning("MME: %d image(s) lack one of their two questions; acc+ counts complete pairs only",
                       incomplete)
    return out


def subtask_table(metrics: Dict[str, Any]) -> str:
    """Markdown table of the per-subtask figures (acc and acc+ in %, as the leaderboard shows)."""
    header = ["subtask", "category", "questions", "acc (%)", "acc+ (%)", "score", "TP", "FN", "TN", "FP",
              "precision", "recall", "other"]
    rows: List[List[Any]] = []
    for s, m in metrics["subtasks"].items():
        rows.append([s, m["category"], m["num_questions"], f"{100 * m['acc']:.2f}", f"{100 * m['acc_plus']:.2f}",
                     f"{m['score']:.2f}", m["TP"], m["FN"], m["TN"], m["FP"], f"{m['precision']:.4f}",
                     f"{m['recall']:.4f}", m["other_num"]])
    notes = total_notes(metrics)
    for total in ("perception", "cognition", "total"):
        rows.append([f"**{total}**", notes.get(f"{total}_score", ""), "", "", "", f"**{metrics[total + '_score']:.2f}**"]
                    + [""] * 7)
    return markdown_table(header, rows)


def total_notes(metrics: Dict[str, Any]) -> Dict[str, str]:
    """perception_score / cognition_score / total_score -> "3 of 14 subtasks missing" when a
    subsample left subtasks missing or incomplete (printed beside each total)."""
    counts = {s: m["num_questions"] for s, m in metrics["subtasks"].items()}
    notes = {f"{name}_score": coverage_note(counts, members, OFFICIAL_COUNTS)
             for name, members in (("perception", PERCEPTION), ("cognition", COGNITION), ("total", SUBTASKS))}
    return {k: v for k, v in notes.items() if v}


register_report("mme", ReportSpec(family="mme", strata="subtask", subtasks=SUBTASKS, subtask_sizes=OFFICIAL_COUNTS,
                                  score_groups=(("perception_score", PERCEPTION), ("cognition_score", COGNITION)),
                                  per_sample_fields=("subtask", "category", "image"),
                                  # uniform yes/no guessing: acc 0.5 and acc+ 0.25, so 50 + 25 per subtask
                                  chance={"score": 75.0}))


@register_metric("mme", benchmarks={"MME": ["Generation", "SingleChoice"]})
def mme_metric(records: List[Dict[str, Any]], formulation: str = "Generation", infer_method: str = "generation",
               eval_stability: bool = False, likelihood_reduction: str = "sum", file: Optional[str] = None,
               mme_parse: Optional[str] = None, **_: Any) -> Dict[str, Any]:
    """MME scores: metrics.subtasks.<s>.{acc, acc_plus, score, TP, FN, TN, FP, precision, recall,
    other_num}, perception_score, cognition_score and the parse rule used."""
    rule = mme_parse or records_parse_rule(records) or "official"
    get_parser(rule)
    if eval_stability:
        check_stability(records, file)
    verdicts = parse_records(records, formulation, infer_method, rule, likelihood_reduction, file)
    metrics = aggregate(verdicts, rule)
    # the yes/no rule only reads free text; record what actually decided the answers
    if infer_method == "likelihood":
        metrics["parse_rule"] = f"likelihood_{likelihood_reduction}"
    elif formulation == "SingleChoice":
        metrics["parse_rule"] = "option_marks"
    if eval_stability:
        metrics["instability"] = instability(verdicts, key="parsed")
    return {"metrics": metrics, "per_sample": verdicts, "tables": {"MME subtasks": subtask_table(metrics)},
            "notes": total_notes(metrics)}


# -- the official tool's results folder -----------------------------------------------------

def _one_line(text: str) -> str:
    """A response fit for one results line: tabs and line breaks become spaces.

    Why it is safe: none of the three parse rules can see a yes/no across whitespace, so the
    parsed answer is unchanged."""
    return text.replace("\r\n", " ").replace("\r", " ").replace("\n", " ").replace("\t", " ")


def _results_lines(path: str) -> List[Tuple[int, str]]:
    """(line number, text) of the non-blank lines of a results file; one error line if not UTF-8."""
    raw_lines = io.StringIO(read_text(path, "results file"), newline="").readlines()
    out = []
    for no, raw in enumerate(raw_lines, 1):
        line = raw[:-2] if raw.endswith("\r\n") else raw.rstrip("\n")
        if line.strip():
            out.append((no, line))
    return out


def _warn_unpaired_positions(path: str, by_image: Dict[str, List[Tuple[int, str, str, str]]],
                             positions: Dict[str, List[int]]) -> None:
    """Warn when an image's two lines are not one positional pair (lines 1-2, 3-4, ...).

    Why: we pair the lines of an image by its name; the official tool pairs lines by position,
    so it would score such a file differently (accuracy+ in particular)."""
    apart = [img for img, pos in positions.items() if len(pos) == 2 and not (pos[0] % 2 == 0 and pos[1] == pos[0] + 1)]
    if apart:
        first = apart[0]
        lines = ", ".join(str(r[0]) for r in by_image[first])
        logger.warning("%s: the two lines of %d image(s) are not adjacent (e.g. %s (lines %s)); they are paired "
                       "by image name here, but the official MME tool pairs lines by position and would score "
                       "this file differently", path, len(apart), first, lines)


def read_official_results(results_dir: str) -> List[Dict[str, Any]]:
    """``<subtask>.txt`` files (image<TAB>question<TAB>GT<TAB>response) -> prediction records.

    Unknown .txt files are ignored (logged); each image must have exactly two lines."""
    if not os.path.isdir(results_dir):
        raise input_error("MME results folder not found", file=results_dir)
    found: Dict[str, str] = {}
    # list_dir refuses names that are not UTF-8, dangling links and case twins (Existence.txt)
    for fname in list_dir(results_dir, "MME results folder", suffix=(".txt",)):
        sub = canonical_subtask(fname[:-4])
        if sub is None:
            logger.info("MME results: ignoring %s (not a subtask name)", fname)
            continue
        found[sub] = os.path.join(results_dir, fname)
    if not found:
        raise input_error(f"no <subtask>.txt results files (subtasks: {', '.join(SUBTASKS)})", file=results_dir)
    records: List[Dict[str, Any]] = []
    for sub in SUBTASKS:
        if sub not in found:
            continue
        path = found[sub]
        by_image: Dict[str, List[Tuple[int, str, str, str]]] = OrderedDict()
        positions: Dict[str, List[int]] = defaultdict(list)
        for pos, (no, line) in enumerate(_results_lines(path)):
            parts = line.split("\t", 3)
            if len(parts) < 4:
                raise input_error(f"expected 4 tab-separated fields (image, question, GT, response), "
                                  f"got {len(parts)}", file=path, record=f"line {no}")
            image, question, gt_raw, response = parts
            image = image.strip()  # stray whitespace around the name, as the official tool ignores it
            positions[image].append(pos)
            gt = normalize_gt(gt_raw)
            if gt is None:
                raise input_error(f"ground truth must be Yes or No, got {gt_raw!r}", file=path,
                                  record=f"line {no}", field="GT")
            by_image.setdefault(image, []).append((no, question, gt, response))
        _warn_unpaired_positions(path, by_image, positions)
        for image, rows in by_image.items():
            if len(rows) != 2:
                raise input_error(f"image {image} has {len(rows)} line(s); MME has exactly 2 per image",
                                  file=path, record=f"line {rows[-1][0]}")
            for k, (no, question, gt, response) in enumerate(rows):
                records.append({
                    "sample_id": f"{sub}/{image}/{k}", "dup_index": 0, "benchmark": "MME",
                    "formulation": "Generation", "inference_method": "generation", "instruct": "",
                    "question": question, "answer": gt, "prediction": response, "history": [],
                    "candidates": ["Yes", "No"], "answer_index": 0 if gt == "Yes" else 1,
                    "meta": {"subtask": sub, "category": category_of(sub), "image": image,
                             "image_key": [sub, image], "question_index": k, "official_question": question,
                             "gt": gt, "source_file": path, "source_line": no},
                })
    return records


def foreign_record(harness: str, subtask: str, image: str, question: str, gt: str, prediction: str,
                   file: str, row: Any, model: Optional[str] = None, parse_rule: Optional[str] = None,
                   trace: Optional[Dict[str, Any]] = None, meta: Optional[Dict[str, Any]] = None,
                   key_question: Optional[str] = None) -> Dict[str, Any]:
    """One row of another harness's MME output as a prediction record of ours.

    The row is identified by what it asked (``item_key``: subtask, image file name, question),
    never by its position; its sample id is ``<subtask>/<image>/<key>``, and ``item_key`` pairs it
    with our records of the same question in compare. ``mme_parse`` is the answer rule the
    harness itself scored with (the default when scoring it). ``key_question``: the question
    without what the harness added around it, where the reader knows that (else ``question``)."""
    key = item_key(subtask, image, question if key_question is None else key_question)
    rec: Dict[str, Any] = {
        "sample_id": f"{subtask}/{image}/{key[4:12]}", "dup_index": 0, "benchmark": "MME",
        "formulation": "Generation", "inference_method": "generation", "instruct": "", "question": question,
        "answer": gt, "prediction": prediction, "history": [], "candidates": ["Yes", "No"],
        "answer_index": 0 if gt == "Yes" else 1, "item_key": key,
        "meta": {"subtask": subtask, "category": category_of(subtask), "image": image, "image_key": [subtask, image],
                 "question_index": None, "official_question": question if key_question is None else key_question,
                 "gt": gt, "harness": harness,
                 "source_file": file, "source_row": row, **(meta or {})}}
    if model:
        rec["model"] = model
    if parse_rule:
        rec["mme_parse"] = parse_rule
    if trace is not None:
        rec["trace"] = trace
    return rec


def check_unique_items(records: List[Dict[str, Any]], file: str, unit: str = "line") -> None:
    """Refuse a harness output that asks one question of one image twice (naming both rows):
    two answers for one item cannot both be scored."""
    seen: Dict[str, Any] = {}
    for r in records:
        key, row = r["item_key"], r["meta"]["source_row"]
        if key in seen:
            raise input_error(f"asks the same question of the same image as {unit} {seen[key]} "
                              f"({r['meta']['subtask']}/{r['meta']['image']}: {question_key(r['question'])!r})",
                              file=file, record=f"{unit} {row}")
        seen[key] = row


def official_response(rec: Dict[str, Any], verdict: Dict[str, Any]) -> str:
    """What to write as the response: the raw text for Generation by generation, else the chosen
    "Yes"/"No" ("" when nothing was chosen, which every rule parses as other)."""
    if rec.get("formulation", "Generation") == "Generation" and rec.get("inference_method", "generation") == "generation":
        return _one_line(str(rec["prediction"]))
    return {"yes": "Yes", "no": "No"}.get(verdict["parsed"], "")


def write_official_results(records: List[Dict[str, Any]], results_dir: str, dup_index: int = 0,
                           likelihood_reduction: str = "sum", file: Optional[str] = None) -> Dict[str, int]:
    """Write our prediction records as the official tool's results folder (one ``<subtask>.txt``
    per subtask, pairs kept together); returns lines written per subtask.

    Only duplicate ``dup_index`` is written (the format holds one answer per question)."""
    if not records:
        raise ReformError("no prediction records to export")
    form = records[0].get("formulation", "Generation")
    method = records[0].get("inference_method", "generation")
    verdicts = parse_records(records, form, method, "official", likelihood_reduction, file)
    dups = {v["dup_index"] for v in verdicts}
    if len(dups) > 1:
        logger.info("MME export: writing duplicate %d of %d", dup_index, len(dups))
    groups: Dict[str, Dict[str, List[str]]] = defaultdict(lambda: OrderedDict())
    for rec, v in zip(records, verdicts):
        if v["dup_index"] != dup_index:
            continue
        meta = rec.get("meta") or {}
        if any(ch in str(v["image"]) for ch in "\t\r\n"):  # one field of a tab-separated line
            raise ReformError(f"{file or 'records'}: sample {rec.get('sample_id')!r}: field 'meta.image' holds a tab or "
                              f"line break ({v['image']!r}); the official results format cannot hold it")
        question = meta.get("official_question") or rec.get("question", "")
        line = f"{v['image']}\t{_one_line(question)}\t{v['gt'].capitalize()}\t{official_response(rec, v)}\n"
        groups[v["subtask"]].setdefault(v["image"], []).append(line)
    os.makedirs(results_dir, exist_ok=True)
    written = {}
    for sub in SUBTASKS:
        if sub not in groups:
            continue
        lines = [ln for pair in groups[sub].values() for ln in pair]
        with open(os.path.join(results_dir, f"{sub}.txt"), "w", encoding="utf-8", newline="") as f:
            f.write("".join(lines))
        written[sub] = len(lines)
    return written


register_prediction_dir_reader("MME", read_official_results)
register_results_exporter("MME", write_official_results)
register_option_choices("mme_parse", PARSE_RULES)
