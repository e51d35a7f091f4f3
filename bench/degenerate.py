"""Worst scoring time per record on degenerate model replies (1 MB of spaces, dots, marks, ...).

Why: real models emit such text (a mark, then whitespace until the token limit; a run of dots;
one endless word), and one quadratic pattern turns one record into minutes. Every answer
extractor and mark parser, and every metric entry point (the MMMT-IF checkers included,
through ``metrics.evaluate``), scores each reply as one record. Each measurement runs in a
forked child with a time limit, so a slow path is reported instead of hanging the bench.

Usage: python bench/degenerate.py [--size 1048576] [--timeout 30] [--only NAME ...] [--smoke]
One line per (entry, reply): CPU seconds of that record. The last line ends with the slowest
scoring record over every entry (a timed-out one counts as --timeout, so the figure is then a
lower bound; a record that raised is listed with its error and counted in errors=).
``redact_text`` (the secrets filter stored server replies pass through) is timed beside it, not
counted in it.

Prints: extractor_worst_seconds=<s> metric_worst_seconds=<s> pif_worst_seconds=<s>
redaction_worst_seconds=<s> worst_entry=<entry:reply> reply_chars=<n> timeout_s=<s> timed_out=<n>
errors=<n> worst_record_seconds=<s>
"""
from __future__ import annotations

import argparse
import logging
import multiprocessing
import os
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from reform_eval.metrics import evaluate  # noqa: E402
from reform_eval.metrics.mme import parse_official, parse_stripped, parse_vlmevalkit, parse_word  # noqa: E402
from reform_eval.metrics.pif import INSTRUCTION_IDS  # noqa: E402
from reform_eval.metrics.single_choice import normalize_text, parse_choice  # noqa: E402
from reform_eval.utils.secrets import redact_text  # noqa: E402

MB = 1 << 20

#: degenerate replies of about ``n`` characters, by name
REPLIES: Dict[str, Callable[[int], str]] = {
    "spaces": lambda n: "A" + " " * (n - 1),
    "spaces_then_word": lambda n: "A" + " " * (n - 2) + "x",
    "dots": lambda n: "." * n,
    "dot_space": lambda n: ". " * (n // 2),
    "marks": lambda n: "(A) " * (n // 4),
    "bare_marks": lambda n: "A" * n,
    "one_word": lambda n: "yes" + "s" * (n - 3),
    "newlines": lambda n: "B" + "\n" * (n - 2) + ".",
    "open_parens": lambda n: "(" * n,
    "digits": lambda n: "1" * (n - 1) + ")",
    "yes_no": lambda n: "yes no " * (n // 7),
}

_SC_OPTIONS = ["yes", "no", "maybe"]


def _sc(benchmark: str, reply: str, **extra: Any) -> Dict[str, Any]:
    return {"sample_id": "s0", "dup_index": 0, "benchmark": benchmark, "formulation": "SingleChoice",
            "inference_method": "generation", "question": "Which one?", "answer_options": list(_SC_OPTIONS),
            "option_marks": ["A", "B", "C"], "answer": 0, "prediction": reply, **extra}


def _iwisdm_meta() -> Dict[str, Any]:
    return {"complexity": "low", "feature_group": "mixed", "response_type": "bool", "n_and": 0, "n_or": 0,
            "n_is_same": 1, "n_not_same": 0, "n_switch": 0, "n_delay": 1, "n_stimuli": 2, "n_distractors": 0,
            "answer_vocabulary": ["true", "false"], "applicable_answers": ["true", "false"]}


def _mme(reply: str, formulation: str) -> Dict[str, Any]:
    rec = {"sample_id": "existence/0001.jpg/0", "dup_index": 0, "benchmark": "MME", "formulation": formulation,
           "inference_method": "generation", "question": "Is there a dog? Please answer yes or no.",
           "answer": "Yes", "prediction": reply,
           "meta": {"subtask": "existence", "image": "0001.jpg", "question_index": 0}}
    if formulation == "SingleChoice":
        rec.update(answer_options=["Yes", "No"], option_marks=["A", "B"], answer=0)
    return rec


def _pif(reply: str) -> Dict[str, Any]:
    return {"sample_id": "c0-t01", "dup_index": 0, "benchmark": "MMMT-IF", "formulation": "Generation",
            "inference_method": "generation", "question": "Describe the image.", "answer": "A reference.",
            "prediction": reply, "meta": {"chat_id": "c0", "turn": 1, "instructions": list(INSTRUCTION_IDS)}}


def _score(rec: Dict[str, Any], **options: Any) -> None:
    evaluate([rec], rec["formulation"], rec["inference_method"], **options)


#: entry name -> (group, function scoring one reply as one record). Groups: ``extractor`` and
#: ``metric`` (linear-time, asserted by tests/test_degenerate.py), ``pif`` (the MMMT-IF
#: checkers), ``redaction`` (timed, not a scoring path)
ENTRIES: Dict[str, Tuple[str, Callable[[str], Any]]] = {
    "parse_choice": ("extractor", lambda r: parse_choice(r, ["A", "B", "C"], _SC_OPTIONS)),
    "parse_choice_numbers": ("extractor", lambda r: parse_choice(r, [str(i) for i in range(1, 121)],
                                                                  [f"o{i}" for i in range(120)])),
    "normalize_text": ("extractor", normalize_text),
    "mme_parse_official": ("extractor", parse_official),
    "mme_parse_stripped": ("extractor", parse_stripped),
    "mme_parse_vlmevalkit": ("extractor", parse_vlmevalkit),
    "mme_parse_word": ("extractor", parse_word),
    "single_choice": ("metric", lambda r: _score(_sc("custom", r))),
    "exact_match": ("metric", lambda r: _score({**_sc("custom", r), "formulation": "Generation", "answer": "yes"})),
    "iwisdm_single_choice": ("metric", lambda r: _score(_sc("iWISDM", r, meta=_iwisdm_meta()))),
    "iwisdm_generation": ("metric", lambda r: _score({**_sc("iWISDM", r, meta=_iwisdm_meta()),
                                                       "formulation": "Generation", "answer": "true"})),
    "mme_official": ("metric", lambda r: _score(_mme(r, "Generation"), mme_parse="official")),
    "mme_stripped": ("metric", lambda r: _score(_mme(r, "Generation"), mme_parse="stripped")),
    "mme_vlmevalkit": ("metric", lambda r: _score(_mme(r, "Generation"), mme_parse="vlmevalkit")),
    "mme_word": ("metric", lambda r: _score(_mme(r, "Generation"), mme_parse="word")),
    "mme_single_choice": ("metric", lambda r: _score(_mme(r, "SingleChoice"))),
    "pif_all_instructions": ("pif", lambda r: _score(_pif(r))),
    "redact_text": ("redaction", redact_text),
}


def _child(entry: str, reply: str, size: int, conn: Any) -> None:
    logging.disable(logging.CRITICAL)
    text = REPLIES[reply](size)
    fn = ENTRIES[entry][1]
    t0 = time.process_time()
    try:
        fn(text)
        error = ""
    except Exception as e:  # a crash is a finding too: reported with its time, never hidden
        error = f"{type(e).__name__}: {str(e)[:120]}"
    conn.send((time.process_time() - t0, error))
    conn.close()


def measure(entry: str, reply: str, size: int = MB, timeout: float = 30.0) -> Tuple[float, bool, str]:
    """(CPU seconds to score ``reply`` of ``size`` characters through ``entry``, timed out?, the
    error it raised or "") in a forked child that is killed after ``timeout`` wall seconds."""
    ctx = multiprocessing.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(entry, reply, size, send), daemon=True)
    proc.start()
    send.close()
    try:
        if recv.poll(timeout):
            try:
                secs, error = recv.recv()
                return float(secs), False, error
            except EOFError:
                return 0.0, False, f"the child died (exit code {proc.exitcode})"
        return float(timeout), True, ""
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join()
        recv.close()


def run(entries: List[str], replies: List[str], size: int, timeout: float,
        out: Optional[Any] = sys.stdout) -> List[Tuple[str, str, float, bool, str]]:
    """Measure every (entry, reply): rows of (entry, reply, seconds, timed out?, error); one
    line each printed to ``out``."""
    rows = []
    for entry in entries:
        for reply in replies:
            secs, timed_out, error = measure(entry, reply, size, timeout)
            rows.append((entry, reply, secs, timed_out, error))
            if out is not None:
                print(f"{ENTRIES[entry][0]:9s} {entry:22s} {reply:16s} {'>' if timed_out else ' '}{secs:9.4f} s"
                      + (f"  ERROR {error}" if error else ""), file=out, flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=int, default=MB, help="characters per reply (default 1 MiB)")
    ap.add_argument("--timeout", type=float, default=30.0, help="wall seconds per record before it is killed")
    ap.add_argument("--only", nargs="*", default=None, help="entries to run (default: all)")
    ap.add_argument("--smoke", action="store_true", help="4 KB replies: checks that the bench runs (seconds), "
                    "measures nothing")
    args = ap.parse_args()
    if args.smoke:
        args.size, args.timeout = 4096, 60.0
    entries = args.only or list(ENTRIES)
    rows = run(entries, list(REPLIES), args.size, args.timeout)
    pairs = []
    for group in ("extractor", "metric", "pif", "redaction"):
        times = [r[2] for r in rows if ENTRIES[r[0]][0] == group]
        if times:
            pairs.append(f"{group}_worst_seconds={max(times):.4f}")
    scoring = [r for r in rows if ENTRIES[r[0]][0] != "redaction"]
    worst = max(scoring, key=lambda r: r[2]) if scoring else None
    if worst:
        pairs.append(f"worst_entry={worst[0]}:{worst[1]}")
    pairs += [f"reply_chars={args.size}", f"timeout_s={args.timeout:g}",
              f"timed_out={sum(r[3] for r in scoring)}", f"errors={sum(bool(r[4]) for r in scoring)}",
              f"worst_record_seconds={worst[2] if worst else 0.0:.4f}"]
    print(" ".join(pairs))


if __name__ == "__main__":
    main()
