"""The comparison plots as a reader sees them (issue 32, part 5): categorical levels (iWISDM's
complexity: identify_category, identify_location, low, medium, high) are drawn as categories
(bars), never as a line that orders them, and no two group labels overlap."""
from __future__ import annotations

import math

import pytest

from reform_eval.evaluation.reporting import plots
from reform_eval.evaluation.reporting.report import compare_runs
from reform_eval.metrics import evaluate
from tests.report_fixtures import iwisdm_records

LEVELS = ("identify_category", "identify_location", "low", "medium", "high")


def _demo_like_run(name: str, seed: int) -> dict:
    """Trials over the demo's five levels (identification and low/medium/high), one model."""
    recs = iwisdm_records(60, 0.6, seed=seed)
    for i, r in enumerate(recs):
        r["meta"]["complexity"] = LEVELS[i % len(LEVELS)]
    return {"name": name, "records": recs, "result": evaluate(recs, "SingleChoice", "generation")}


def _drawn(monkeypatch, runs, tmp_path) -> dict:
    """What each plot's first axes holds when it is saved: lines joining points, bars, labels."""
    seen = {}
    save = plots._save

    def spy(fig, out_dir, name):
        ax = fig.axes[0]
        joined = [ln for ln in ax.get_lines() if len(ln.get_xdata()) > 1 and ln.get_linestyle() not in ("None", "")]
        labels = [t for t in ax.get_xticklabels() if t.get_text()]
        overlap = plots.labels_overlap(fig, ax)
        renderer = fig.canvas.get_renderer()
        ticks = sorted(ax.transData.transform([(x, 0) for x in ax.get_xticks()])[:, 0])
        spacing = min((b - a for a, b in zip(ticks, ticks[1:])), default=math.inf)
        height = max((t.get_window_extent(renderer).height for t in labels), default=0)
        seen[name] = {"joined": joined, "bars": len(ax.patches), "labels": [t.get_text() for t in labels],
                      "rotation": {t.get_rotation() for t in labels}, "overlap": overlap, "spacing": spacing,
                      "line_height": height}
        return save(fig, out_dir, name)

    monkeypatch.setattr(plots, "_save", spy)
    compare_runs(runs, str(tmp_path), n_boot=50)
    return seen


def test_complexity_levels_are_categories_and_their_labels_never_overlap(monkeypatch, tmp_path):
    names = ["llava:tiny-trained likelihood", "llava:tiny-trained generation", "llava:tiny likelihood",
             "llava:tiny generation", "random", "constant"]
    drawn = _drawn(monkeypatch, [_demo_like_run(n, i) for i, n in enumerate(names)], tmp_path)
    c = drawn["iwisdm_complexity"]
    assert c["joined"] == []  # no line joins the levels as if they were ordered
    assert c["bars"] >= len(LEVELS) * len(names)  # one bar per model and level
    assert c["labels"] == ["low", "medium", "high", "identify_\ncategory", "identify_\nlocation"]
    for name, d in drawn.items():
        if d["rotation"] == {0.0}:
            assert not d["overlap"], name
        else:  # rotated labels are parallel: apart when the ticks are more than a line apart
            assert d["spacing"] * math.sin(math.radians(45)) >= d["line_height"] / 2, name


def test_many_long_groups_rotate_rather_than_overlap(monkeypatch, tmp_path):
    long = [f"a_rather_long_group_name_{k}" for k in range(12)]
    runs = []
    for i, n in enumerate(("a", "b")):
        recs = iwisdm_records(48, 0.6, seed=i)
        for j, r in enumerate(recs):
            r["meta"]["complexity"] = long[j % len(long)]
        runs.append({"name": n, "records": recs, "result": evaluate(recs, "SingleChoice", "generation")})
    d = _drawn(monkeypatch, runs, tmp_path)["iwisdm_complexity"]
    assert d["rotation"] == {45.0} and d["joined"] == []


@pytest.mark.parametrize("name,expected", [("identify_category", "identify_\ncategory"), ("low", "low"),
                                           ("bottom left", "bottom\nleft"), ("category-only", "category-\nonly"), ("mixed", "mixed")])
def test_group_names_wrap_after_underscores_hyphens_and_at_spaces(name, expected):
    assert plots._wrap_name(name) == expected
