"""Writing a report: one run's or a comparison's tables, plots and report.html, as one unit.

``compare_runs`` writes ``comparison.md``, ``comparison.json``, ``plots/`` and ``report.html``
into ``output_dir``; ``write_run_report`` is the one-run case. A comparison of exactly two runs
also explains the second against the first (``evaluation.reporting.explain``): with more runs
there is no one pair to explain, and ``run_loader_eval --explain A B`` names the pair. The numbers come from
``evaluation.reporting.compare``; this module only lays them out on disk.
"""
from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Sequence

from .compare import _json_safe, build_comparison, markdown
from .explain import NothingToExplain, explain_runs, explanation_notes, explanation_tables
from .html import render
from .plots import make_plots
from ...utils.commit import Commit, clean_stale_temps
from ...utils.predictions import ensure_writable_dir


def compare_runs(runs: Sequence[Dict[str, Any]], output_dir: str, seed: int = 0, n_boot: int = 1000,
                 plots: bool = True, html: bool = True, commit: Optional[Commit] = None) -> Dict[str, Any]:
    """Write comparison.md/.json, plots/ and report.html for ``runs``; return the comparison
    (with ``files``: the paths written).

    The four outputs are one unit (``utils.commit``): staged, then renamed into place, ``plots/``
    replacing the old folder whole, so the folder never holds plots of an earlier comparison
    beside this one's tables. With ``commit`` they join that caller's unit."""
    comp = build_comparison(runs, seed=seed, n_boot=n_boot)
    if len(runs) == 2:  # two runs of one benchmark: why their answers differ (one pair, one section)
        try:
            exp = explain_runs(runs[0], runs[1])
            comp["explain"] = {**exp, "tables": explanation_tables(exp), "notes": explanation_notes(exp)}
        except NothingToExplain as e:  # no sample in common: the comparison says so, explains nothing
            comp["explain"] = {"refused": str(e), "tables": [], "notes": [str(e)]}
    ensure_writable_dir(output_dir, "report directory")
    clean_stale_temps(output_dir, depth=1)
    own = commit is None
    c = commit if commit is not None else Commit(f"comparison in {output_dir}")
    files = {"comparison_json": os.path.join(output_dir, "comparison.json"),
             "comparison_md": os.path.join(output_dir, "comparison.md")}
    try:
        staged_plots: List[str] = []
        plots_dir = os.path.join(output_dir, "plots")
        if plots:
            staged_plots = make_plots(comp, runs, c.folder(plots_dir))
        else:
            c.remove(plots_dir)
        final_plots = [os.path.join(plots_dir, os.path.basename(p)) for p in staged_plots]
        comp["plots"] = [os.path.relpath(p, output_dir) for p in final_plots]
        comp = _json_safe(comp)
        c.write_text(files["comparison_md"], markdown(comp, [p for p in final_plots if p.endswith(".png")]))
        if html:
            files["report_html"] = c.write_text(os.path.join(output_dir, "report.html"),
                                                render(comp, runs, staged_plots))
        else:
            c.remove(os.path.join(output_dir, "report.html"))
        c.write_json(files["comparison_json"], comp, last=True)
    except BaseException:
        c.abort()
        raise
    if own:
        c.commit()
    comp["files"] = files
    return comp


def write_run_report(run: Dict[str, Any], output_dir: str, seed: int = 0, n_boot: int = 1000,
                     commit: Optional[Commit] = None) -> Dict[str, Any]:
    """The same report for a single run (no paired tests); with ``commit``, part of that unit."""
    return compare_runs([run], output_dir, seed=seed, n_boot=n_boot, commit=commit)
