"""Linear-time scoring: degenerate replies (runs of spaces, dots, marks, newlines, one long word,
unclosed parentheses) score in well under a second per record through every answer extractor
and metric entry point (bench/degenerate.py measures the same at 1 MiB). The bound is generous
on purpose: a quadratic path takes minutes at this size, so any regression fails here."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from bench.degenerate import ENTRIES, REPLIES, measure

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIZE = 256 * 1024
BOUND_S = 2.0

LINEAR = [e for e, (group, _) in ENTRIES.items() if group in ("extractor", "metric")]

@pytest.mark.parametrize("entry", LINEAR)
def test_extractors_and_metrics_are_linear_on_degenerate_replies(entry):
    slow = []
    for reply in REPLIES:
        secs, timed_out, error = measure(entry, reply, SIZE, timeout=60)  # (CPU seconds decide; 60 s of wall only guards)
        assert not error, (entry, reply, error)
        if timed_out or secs >= BOUND_S:
            slow.append((reply, secs))
    assert not slow, f"{entry}: {slow}"


@pytest.mark.slow
def test_pif_checkers_are_linear_on_degenerate_replies():
    slow = []
    for reply in REPLIES:
        secs, timed_out, error = measure("pif_all_instructions", reply, SIZE, timeout=60)
        if error or timed_out or secs >= BOUND_S:
            slow.append((reply, secs, error))
    assert not slow, slow


def test_bench_prints_the_worst_record_line():
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "degenerate.py"), "--size", "4096",
                           "--timeout", "10", "--only", "parse_choice", "mme_official"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 2 * len(REPLIES) + 1
    last = lines[-1]
    assert re.search(r"(^| )worst_record_seconds=\d+\.\d+$", last), last
    assert "timed_out=0" in last and "errors=0" in last and "extractor_worst_seconds=" in last
