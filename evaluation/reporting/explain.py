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
  question (``compare.question_key``: the benchmark, the question text, the right answer, the
  option texts, ``meta`` and the image file names). Each sample's attribution reads ``trace``
  (``prompt_sha``: sha256[:16] of the exact text or messages JSON the model or server got; ``prompt_tokens``; ``bos``;
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

The explanation pairs the runs by item (``compare.pair_runs``, which also matches another
harness's rows by the benchmark's item key; then the same question asked another way, e.g. with
other option marks or the same images at another resolution, by ``compare.question_key``; never by
position), lists every difference of the run-level records (named as
a researcher knows them: ``explain_factors.FACTORS``; paths, run ids, timings and output folders are left out,
``IGNORED``), and for each sample whose verdict changed (right in one run, wrong in the other; for PIF a changed
per-turn PIF), and apart from those each whose extracted answer alone changed (generation), says
which differences touch it: its prompt (text or tokens differ), its pixels (the image tensor or
the images' sizes differ), or only settings (dtype, parse mode, ...: what acts on every sample).
It ends with one line: "accuracy moved by X (a to b): N verdicts changed (R to right, W to
wrong: R-W of P paired samples); M of them have different prompts, K different pixels, J only
different settings", X being the two runs' own headline accuracies' difference; answer-only
changes and, where pairing was partial, what the paired part moved and what was left out
(counted) follow. Runs that share no sample are refused (``NothingToExplain``).
"""
from __future__ import annotations

import os
import re
from typing import Any, Dict, List, Optional, Tuple

from .bootstrap import family_of
from .compare import Key, pair_runs, same_content, sample_shas, unpaired, unpaired_text
from .explain_factors import (ALSO_PROMPT, PIXELS, PROMPT, SETTINGS, run_differences, run_facts,
                                                  shown_value)
from ...utils.errors import ReformError, input_error
from ...utils.inputs import read_json

# -- how one item was asked --------------------------------------------------------------------------

#: the fields of a sample (docs: the unified sample) that say how one question was asked; with the
#: fields ``compare.question_key`` holds equal, what else can differ in an item is its images' content
ITEM_FIELDS: Tuple[Tuple[str, str, str], ...] = (
    ("option_marks", "option marks", PROMPT), ("answer_options", "option order", PROMPT),
    ("question", "question text", PROMPT), ("instruct", "instruction", PROMPT), ("history", "history turns", PROMPT),
    ("formulation", "formulation", PROMPT), ("image_ablation", "image ablation", PIXELS))


# -- pairing -------------------------------------------------------------------------------------------

def _key(r: Dict[str, Any]) -> Key:
    return (str(r.get("sample_id")), int(r.get("dup_index", 0) or 0))


def pair_records(a: Dict[str, Any], b: Dict[str, Any]) -> List[Tuple[Key, Key, str]]:
    """[(a's key, b's key, how)]: ``compare.pair_runs``' pairs (the one pairing of compare, the
    paired tests and this explanation), each named by the rule that made it: ``item`` (the same
    item content under one key), ``item key`` (a row of another harness's log matched to our
    item by the benchmark's item key) or ``question`` (the same question asked another way:
    ``compare.question_key``)."""
    sa, sb = sample_shas(a), sample_shas(b)
    return [(ka, kb, "item key" if ka != kb else "item" if same_content(sa.get(ka), sb.get(kb)) else "question")
            for ka, kb in pair_runs(a, b)[0]]


# -- one pair of samples --------------------------------------------------------------------------------

def _trace(r: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    t = r.get("trace")
    return t if isinstance(t, dict) else None


def _both(ta: Optional[Dict[str, Any]], tb: Optional[Dict[str, Any]], field: str) -> bool:
    return bool(ta and tb) and ta.get(field) is not None and tb.get(field) is not None  # type: ignore[union-attr]


def prompt_differs(ra: Dict[str, Any], rb: Dict[str, Any]) -> Optional[bool]:
    """Did the model get another prompt: the rendered text (trace ``prompt_sha``) or its tokens
    (``bos``, ``prompt_tokens``, where both traces know them); without the rendered text's hash
    on both, the preprocessor's output (the record's ``prompt_sha``); None when neither is known
    for both (a trace field that is null is unknown, never equal)."""
    ta, tb = _trace(ra), _trace(rb)
    if _both(ta, tb, "prompt_sha"):
        return any(ta[f] != tb[f] for f in ("prompt_sha", "bos", "prompt_tokens")  # type: ignore[index]
                   if _both(ta, tb, f))
    if ra.get("prompt_sha") and rb.get("prompt_sha"):
        return ra["prompt_sha"] != rb["prompt_sha"]
    return None


def _pixels(r: Dict[str, Any]) -> Optional[str]:
    """The trace's pixel hash; "no images" for a record without images; None when unknown (no
    trace, or a null hash beside images: a foreign log, a layout the trace cannot split)."""
    t = _trace(r)
    if t and t.get("pixel_sha") is not None:
        return str(t["pixel_sha"])
    return "no images" if t is not None and r.get("image_ids") == [] else None  # (a record that names none)


def _images(r: Dict[str, Any]) -> Optional[str]:
    """The trace's hash of the images' content (``image_sha``: every engine knows it); "no
    images" for a record without images; None when unknown."""
    t = _trace(r)
    if t and t.get("image_sha") is not None:
        return str(t["image_sha"])
    return "no images" if t is not None and r.get("image_ids") == [] else None


def pixels_differ(ra: Dict[str, Any], rb: Dict[str, Any], processing_differs: bool = False) -> Optional[bool]:
    """Did the model get other pixels: the pixel tensor's hash or the images' sizes (trace,
    where both engines know the tensor: in process); else the images' content (``image_sha``)
    and, for the same images, whether the runs record another processing of them
    (``processing_differs``: a run-level pixel factor, e.g. the image processor's backend or
    output size, or the image encoding sent to a server); None when either is unknown."""
    pa, pb = _pixels(ra), _pixels(rb)
    ta, tb = _trace(ra), _trace(rb)
    sizes = bool(_both(ta, tb, "image_sizes") and ta["image_sizes"] != tb["image_sizes"])  # type: ignore[index]
    if pa is not None and pb is not None:
        return pa != pb or sizes
    ia, ib = _images(ra), _images(rb)
    if ia is None or ib is None:
        return None
    if ia != ib or sizes:
        return True
    return processing_differs and ia != "no images"


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


def _verdict_changed(pa: Dict[str, Any], pb: Dict[str, Any], family: str) -> bool:
    """Right in one run and wrong in the other; for MMMT-IF, another per-turn PIF (the verdict;
    which instructions were followed alone is an answer change, ``_answer_changed``)."""
    if family == "pif":
        return pa.get("pif") != pb.get("pif")
    return bool(pa.get("correct")) != bool(pb.get("correct"))


def _answer_changed(pa: Dict[str, Any], pb: Dict[str, Any], family: str, generation: bool) -> bool:
    """Another extracted answer under the same verdict (generation: yes read as 'other', a
    wrong option read as another wrong option; MMMT-IF: other instructions followed at the same
    PIF); never counted as a verdict change."""
    if family == "pif":
        return pa.get("followed") != pb.get("followed")
    return generation and _answer(pa) != _answer(pb)


def _verdict_text(p: Dict[str, Any], family: str) -> str:
    if family == "pif":
        return f"pif {float(p.get('pif') or 0.0):.2f}"
    return "right" if p.get("correct") else "wrong"


# -- the explanation -----------------------------------------------------------------------------------

def _methods(run: Dict[str, Any]) -> set:
    return {str(r.get("inference_method")) for r in run["records"] if r.get("inference_method")}


class NothingToExplain(ReformError):
    """Two runs with no sample in common: no pair to explain (one line, exit 2)."""


def headline(result: Dict[str, Any], field: str) -> float:
    """A run's headline accuracy (or PIF), as its results report it: the metric, else the mean of
    every scored sample's verdict."""
    value = (result.get("metrics") or {}).get("pif" if field == "pif" else "accuracy")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    ps = result.get("per_sample") or []
    return sum(float(p.get(field) or 0.0) for p in ps) / len(ps) if ps else 0.0


def explain_runs(a: Dict[str, Any], b: Dict[str, Any], info_a: Optional[Dict[str, Any]] = None,
                 info_b: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """The explanation of B against A, as data (JSON-ready); ``format_explanation`` writes it.

    ``a``/``b``: runs ``{"name", "records", "result"}`` (``result`` scored: ``metric``,
    ``metrics``, ``per_sample``); ``info_*``: their run-level records (default: ``info_of``).
    Runs that share no sample are refused (``NothingToExplain``): there is no pair to explain."""
    for run in (a, b):
        if not (run.get("result") or {}).get("per_sample"):
            raise ReformError(f"run '{run.get('name')}': no scored samples to explain")
    benches = [sorted({str(r.get("benchmark")) for r in run["records"] if r.get("benchmark")}) for run in (a, b)]
    if benches[0] and benches[1] and benches[0] != benches[1]:
        raise ReformError(f"explain: the runs are of different benchmarks ({', '.join(benches[0])}; "
                          f"{', '.join(benches[1])}); explain two runs of one benchmark")
    metric_a, metric_b = a["result"].get("metric"), b["result"].get("metric")
    if metric_a != metric_b:
        raise ReformError(f"explain: the runs were scored by different metrics ({metric_a!r}, {metric_b!r}); "
                          "explain two runs of one benchmark")
    family = family_of(metric_a)
    ra, rb = {_key(r): r for r in a["records"]}, {_key(r): r for r in b["records"]}
    va, vb = _verdicts(a["result"]), _verdicts(b["result"])
    pairs = [(ka, kb, how) for ka, kb, how in pair_records(a, b)
             if ka in va and kb in vb and ka in ra and kb in rb]
    left = unpaired(list(va), list(vb), [(ka, kb) for ka, kb, _ in pairs])
    if not pairs:
        raise NothingToExplain(f"explain: A ({a['name']}) and B ({b['name']}) share no sample: "
                               f"{unpaired_text(left)}; explain two runs of the same items")
    fa, reca = run_facts(info_a if info_a is not None else info_of(a), str(a.get("source") or a["name"]))
    fb, recb = run_facts(info_b if info_b is not None else info_of(b), str(b.get("source") or b["name"]))
    methods = _methods(a) | _methods(b)
    diffs, one_sided = run_differences(fa, reca, fb, recb, methods)
    generation = "generation" in methods
    field = "pif" if family == "pif" else "correct"
    by_kind = {kind: [d["factor"] for d in diffs if d["kind"] == kind or (kind == PROMPT and d["factor"] in ALSO_PROMPT)]
               for kind in (PROMPT, PIXELS, SETTINGS)}
    item_factors: Dict[str, Dict[str, Any]] = {}
    flips: List[Dict[str, Any]] = []
    answers: List[Dict[str, Any]] = []
    sums = [0.0, 0.0]
    for ka, kb, how in pairs:
        pa, pb = va[ka], vb[kb]
        sums[0] += float(pa.get(field) or 0.0)
        sums[1] += float(pb.get(field) or 0.0)
        items = item_differences(ra[ka], rb[kb], how)
        for name, kind in items:
            item_factors.setdefault(name, {"factor": name, "kind": kind, "samples": 0})["samples"] += 1
        verdict = _verdict_changed(pa, pb, family)
        if not verdict and not _answer_changed(pa, pb, family, generation):
            continue
        prompt, pixels = prompt_differs(ra[ka], rb[kb]), pixels_differ(ra[ka], rb[kb], bool(by_kind[PIXELS]))
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
        (flips if verdict else answers).append(
            {"sample_id": ka[0], "dup_index": ka[1], "paired_by": how, **({"sample_id_b": kb[0]} if kb != ka else {}),
             "a": _verdict_text(pa, family), "b": _verdict_text(pb, family),
             "answer_a": _answer(pa), "answer_b": _answer(pb),
             "prompt_differs": prompt, "pixels_differ": pixels, "touched_by": touching})
    for name, entry in item_factors.items():  # the ways items were asked differently join the run's factors
        if not any(d["factor"] == name for d in diffs):
            diffs.append({"factor": name, "kind": entry["kind"], "a": "-", "b": "-",
                          "keys": [f"records ({entry['samples']} paired items)"]})
        else:
            next(d for d in diffs if d["factor"] == name)["keys"].append(f"records ({entry['samples']} paired items)")
    n = len(pairs)
    head_a, head_b = headline(a["result"], field), headline(b["result"], field)
    counts = {"prompt": sum(1 for f in flips if f["prompt_differs"]),
              "pixels": sum(1 for f in flips if f["pixels_differ"]),
              "settings": sum(1 for f in flips if f["prompt_differs"] is False and f["pixels_differ"] is False),
              "unknown": sum(1 for f in flips if not f["prompt_differs"] and not f["pixels_differ"]
                             and (f["prompt_differs"] is None or f["pixels_differ"] is None)),
              "to_right": sum(1 for f in flips if f["b"] == "right"),
              "to_wrong": sum(1 for f in flips if f["b"] == "wrong"),
              "answers": len(answers)}
    exp = {"a": {"name": a["name"], "prediction_file": a["result"].get("prediction_file")},
           "b": {"name": b["name"], "prediction_file": b["result"].get("prediction_file")},
           "family": family, "statistic": "pif" if family == "pif" else "accuracy", "n_pairs": n,
           "n_a": len(va), "n_b": len(vb), "headline_a": head_a, "headline_b": head_b,
           "paired_by_item": sum(1 for _, _, how in pairs if how == "item"),
           "paired_by_item_key": sum(1 for _, _, how in pairs if how == "item key"),
           "paired_by_question": sum(1 for _, _, how in pairs if how == "question"),
           "unpaired": left, "refused": left["other_content"], "only_a": left["only_a"], "only_b": left["only_b"],
           "differences": diffs, "recorded_by_one_run": one_sided,
           "no_difference": not diffs and not flips and not answers and not any(left.values()),
           "moved": head_b - head_a, "moved_paired": (sums[1] - sums[0]) / n, "score_moved": None,
           "flips": sorted(flips, key=lambda f: (f["sample_id"], f["dup_index"])),
           "answer_changes": sorted(answers, key=lambda f: (f["sample_id"], f["dup_index"])), "counts": counts}
    if family == "mme":
        ta, tb = (a["result"].get("metrics") or {}).get("total_score"), (b["result"].get("metrics") or {}).get("total_score")
        if isinstance(ta, (int, float)) and isinstance(tb, (int, float)):
            exp["score_moved"] = float(tb) - float(ta)
    exp["summary"] = summary_line(exp)
    return exp


def summary_line(exp: Dict[str, Any]) -> str:
    """The last line: the headline moved (B minus A, each run's own headline), the verdicts that
    changed and what touches them, the answers that changed alone, and, where the runs did not
    all pair, what the paired part moved and what was left out, so the numbers add up."""
    stat, counts, n = exp["statistic"], exp["counts"], exp["n_pairs"]
    lead = f"{stat} moved by {exp['moved']:+.4f} ({exp['headline_a']:.4f} to {exp['headline_b']:.4f})"
    if exp.get("score_moved") is not None:
        lead += f" and the MME score by {exp['score_moved']:+.1f}"
    k = len(exp["flips"])
    if stat == "pif":
        changed = f"{k} sample{'' if k == 1 else 's'} changed their PIF ({exp['moved_paired'] * n:+.2f} of {n} paired)"
    else:
        net = counts["to_right"] - counts["to_wrong"]
        changed = (f"{k} verdict{'' if k == 1 else 's'} changed ({counts['to_right']} to right, {counts['to_wrong']} "
                   f"to wrong: {net:+d} of {n} paired samples)")
    out = (f"{lead}: {changed}; {counts['prompt']} of them have different prompts, {counts['pixels']} different "
           f"pixels, {counts['settings']} only different settings")
    if counts["unknown"]:
        out += f", {counts['unknown']} unknown (no trace or prompt hash to tell)"
    if exp["answer_changes"]:
        m = len(exp["answer_changes"])
        out += f"; {m} more answer{'' if m == 1 else 's'} changed without changing a verdict"
    if any(exp["unpaired"].values()):
        out += (f"; on the {n} paired samples it moved by {exp['moved_paired']:+.4f}, the rest by the samples not "
                f"paired ({unpaired_text(exp['unpaired'])})")
    return out


# -- text ---------------------------------------------------------------------------------------------

#: what each kind of factor acts on, in words
KIND_TEXT = {PROMPT: "each sample's prompt", PIXELS: "each sample's pixels", SETTINGS: "every sample"}


def _sample_rows(rows: List[Dict[str, Any]]) -> List[List[str]]:
    return [[f"{f['sample_id']}" + (f" #{f['dup_index']}" if f["dup_index"] else ""), f["a"], f["b"],
             shown_value(f["answer_a"], 40), shown_value(f["answer_b"], 40), ", ".join(f["touched_by"]) or "none recorded"]
            for f in rows]


def explanation_tables(exp: Dict[str, Any], max_rows: int = 200) -> List[Tuple[str, List[str], List[List[str]]]]:
    """(title, header, rows) of the differences, the samples whose verdict changed and those
    whose answer alone changed (each at most ``max_rows``)."""
    out = []
    rows = [[d["factor"], d["a"], d["b"], KIND_TEXT[d["kind"]], ", ".join(d["keys"])] for d in exp["differences"]]
    out.append((f"Explanation: differences between A ({exp['a']['name']}) and B ({exp['b']['name']})",
                ["factor", "A", "B", "acts on", "recorded as"], rows or [["none", "-", "-", "-", "-"]]))
    header = ["sample", "A", "B", "A answer", "B answer", "differences touching it"]
    for key, what in (("flips", "samples whose verdict changed"),
                      ("answer_changes", "samples whose answer changed but not their verdict")):
        listed = exp.get(key) or []
        if listed:
            title = f"Explanation: {what} ({len(listed)}" + (
                f", first {max_rows} shown)" if len(listed) > max_rows else ")")
            out.append((title, header, _sample_rows(listed[:max_rows])))
    return out


def explanation_notes(exp: Dict[str, Any]) -> List[str]:
    """The pairing in one sentence, "no difference" when so, and the summary line (last)."""
    by_key = f"{exp['paired_by_item_key']} by the benchmark's item key (another harness's rows), " \
        if exp.get("paired_by_item_key") else ""
    notes = [f"Paired {exp['n_pairs']} samples by item ({exp['paired_by_item']} of the same content, {by_key}"
             f"{exp['paired_by_question']} of the same question asked another way) of {exp['n_a']} in A and "
             f"{exp['n_b']} in B; not paired (not compared): {unpaired_text(exp['unpaired'])}."]
    for side in ("A", "B"):
        names = [d["factor"] for d in exp["recorded_by_one_run"] if d["recorded_by"] == side]
        if names:
            notes.append(f"Recorded by {side} only (not compared): {', '.join(names)}.")
    if exp["no_difference"]:
        notes.append("no difference: the runs agree on every setting both record, every sample paired, and no "
                     "verdict or answer changed.")
    elif not exp["differences"] and (exp["flips"] or exp["answer_changes"]):
        notes.append("no recorded difference: the changed samples are not explained by anything recorded "
                     "(nondeterminism, or something neither run records).")
    elif not exp["differences"]:
        notes.append("no recorded difference and no changed sample: the headline moved only by the samples not paired.")
    return notes + [exp["summary"]]


def _path(path: Optional[str]) -> str:
    """A file as the reader typed it: relative to the working folder when it lies below it."""
    if not path:
        return "-"
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


def format_explanation(exp: Dict[str, Any], max_rows: int = 50) -> str:
    """The explanation as console text, ending with the summary line."""
    lines = ["explain B against A"]
    for x in ("A", "B"):
        run = exp[x.lower()]
        scored = f"; scoring from {os.path.basename(run['scored_with'])}" if run.get("scored_with") else ""
        lines.append(f"  {x}: {run['name']} ({_path(run['prediction_file'])}{scored})")
    lines.append("")
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


def scoring_of(result: Dict[str, Any]) -> Dict[str, Any]:
    """What made a scored result's verdicts: its scoring settings, and the parse rule its metric
    says it applied (MME: the option, a foreign log's own rule, or the likelihood reduction)."""
    out = {k: result[k] for k in SCORING_FIELDS if k in result}
    rule = (result.get("metrics") or {}).get("parse_rule") if isinstance(result.get("metrics"), dict) else None
    if rule is not None:
        out["parse_rule"] = rule
    return out


def info_of(run: Dict[str, Any]) -> Dict[str, Any]:
    """A run's run-level record: its ``info`` when given, else its result when that holds the
    run's record (``run_eval --do_eval``), else the run's own results or run file beside its
    prediction file; the scoring settings always from the result that made the verdicts."""
    result = run.get("result") or {}
    info = run.get("info")
    if info is None:
        info = result if (result.get("provenance") is not None or result.get("config") is not None) \
            else recorded_info(result.get("prediction_file"))[0]
    return {**info, **scoring_of(result)}


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
