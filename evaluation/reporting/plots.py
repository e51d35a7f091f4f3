"""Comparison plots (PNG and SVG) drawn from the comparison data, never from raw results again.

Every point carries its bootstrap 95% interval (error bars or a band); iWISDM plots draw the
chance level the metric reports for each breakdown row, so a bar is read against guessing.
"""
from __future__ import annotations

import functools
import os
import re
import textwrap
import warnings
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ...metrics import report_spec
from ...utils.errors import ReformError
from ...utils.predictions import temp_prefix

#: every text we draw is plain text: model and group names come from users, and a ``$`` in one
#: must be drawn as written, never parsed as mathtext or LaTeX (``$\\frac{1}{$`` would crash)
PLAIN_TEXT = {"text.usetex": False, "text.parse_math": False}


@functools.lru_cache(maxsize=None)
def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend with our style, imported on the first plot: a run
    or a scoring that draws nothing never pays for matplotlib."""
    import matplotlib  # heavy (issue 24: instant start); loaded by the first plot

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"svg.fonttype": "none", "figure.dpi": 100, "axes.spines.top": False,
                         "axes.spines.right": False, "font.size": 9})
    return plt


def plain_text(fn: Any) -> Any:
    """Run a plotting function with PLAIN_TEXT in force: a Text takes ``parse_math`` from the
    settings when it is created, so every title, tick label and legend entry made inside is plain."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with pyplot().rc_context(PLAIN_TEXT):
            return fn(*args, **kwargs)
    return wrapper


def legend_label(name: str) -> str:
    """A legend entry for a user's name: matplotlib hides labels that start with ``_``, so such a
    name gets a leading space rather than vanishing from the legend."""
    return f" {name}" if str(name).startswith("_") else str(name)


def _legend_below(ax: Any, n: int) -> None:
    """The legend under the axes, where it cannot hide a bar or a line."""
    ax.legend(fontsize=8, frameon=False, loc="upper center", bbox_to_anchor=(0.5, -0.2 if ax.get_xlabel() else -0.12), ncol=min(n, 4))


#: characters per line of a model's name under its bar
TICK_WIDTH = 22


def _model_ticks(ax: Any, names: Sequence[str]) -> None:
    """One tick per bar, each model name wrapped onto short horizontal lines: a long name
    (a prediction file's stem) rotated would squeeze the axes into a corner of the figure."""
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(["\n".join(textwrap.wrap(str(n), TICK_WIDTH, break_long_words=True, break_on_hyphens=False)
                                  or [str(n)]) for n in names], fontsize=7)


#: characters per line of a group's name under its bars (names break after ``_`` or ``-`` and at spaces)
GROUP_WIDTH = 10


def _wrap_name(name: str, width: int = GROUP_WIDTH) -> str:
    """``identify_category`` -> ``identify_`` / ``category``: a group name on short lines, broken
    after an underscore or a hyphen or at a space, never inside a word."""
    lines: List[str] = []
    for part in (p for p in re.split(r"(?<=[_ -])", str(name)) if p):
        if lines and len(lines[-1]) + len(part.rstrip()) <= width:
            lines[-1] += part
        else:
            lines.append(part)
    return "\n".join(line.rstrip() for line in lines) or str(name)


def labels_overlap(fig: Any, ax: Any) -> bool:
    """Whether two of the x tick labels of ``ax`` touch, as drawn (after ``tight_layout``, which
    ``_save`` applies too)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        fig.tight_layout()
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    boxes = sorted((t.get_window_extent(renderer) for t in ax.get_xticklabels() if t.get_text()),
                   key=lambda b: b.x0)
    return any(a.x1 + 2 > b.x0 for a, b in zip(boxes, boxes[1:]))


def _category_ticks(fig: Any, ax: Any, groups: Sequence[str], rotate: bool = False) -> None:
    """One tick per group, the labels never overlapping: wrapped onto short horizontal lines, and
    rotated 45 degrees where even so they would touch (many groups, long names) or when asked."""
    ax.set_xticks(range(len(groups)))
    if not rotate:
        ax.set_xticklabels([_wrap_name(g) for g in groups], rotation=0, ha="center")
        if not labels_overlap(fig, ax):
            return
    ax.set_xticklabels(groups, rotation=45, ha="right", rotation_mode="anchor")


def _save(fig: Any, out_dir: str, name: str) -> List[str]:
    """PNG and SVG, each written to a temporary file and renamed (a full disk leaves no half plot)."""
    paths = []
    with warnings.catch_warnings():  # long model names: tight_layout gives up (a warning per plot);
        warnings.simplefilter("ignore", UserWarning)  # bbox_inches="tight" below still fits them
        fig.tight_layout()
    try:
        os.makedirs(out_dir, exist_ok=True)
        for ext in ("png", "svg"):
            path = os.path.join(out_dir, f"{name}.{ext}")
            tmp = os.path.join(out_dir, temp_prefix(path) + f"{os.getpid()}.{ext}")
            try:
                fig.savefig(tmp, format=ext, metadata={"Date": None} if ext == "svg" else None, bbox_inches="tight")
                os.replace(tmp, path)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
            paths.append(path)
    except OSError as e:
        raise ReformError(f"{out_dir}: cannot write plot {name} ({e.strerror or e})") from None
    finally:
        pyplot().close(fig)
    return paths


def _series(comp: Dict[str, Any], breakdown: str, stat: str, groups: Sequence[str]
            ) -> List[Tuple[str, List[float], List[float], List[float]]]:
    """Per model: (name, values, lower error, upper error) over ``groups`` (NaN where missing)."""
    out = []
    nan = float("nan")
    for m in comp["models"]:
        rows = m["breakdowns"].get(breakdown, {})
        vals, lo, hi = [], [], []
        for g in groups:
            cell = (rows.get(g) or {}).get(stat) or {}
            v = cell.get("value")
            vals.append(nan if v is None else v)
            # no interval: NaN, so no error bar or band is drawn (a zero-length one reads as [v, v])
            lo.append(nan if v is None or cell.get("low") is None else max(v - cell["low"], 0.0))
            hi.append(nan if v is None or cell.get("high") is None else max(cell["high"] - v, 0.0))
        out.append((m["name"], vals, lo, hi))
    return out


def _groups(comp: Dict[str, Any], breakdown: str) -> List[str]:
    groups: List[str] = []
    for m in comp["models"]:
        groups += [g for g in m["breakdowns"].get(breakdown, {}) if g not in groups]
    return groups


def _chance(comp: Dict[str, Any], breakdown: str, groups: Sequence[str]) -> Optional[List[float]]:
    for m in comp["models"]:
        ch = m.get("chance_by", {}).get(breakdown)
        if ch:
            return [float("nan") if ch.get(g) is None else ch[g] for g in groups]
    return None


def _draw_zeros(ax: Any, xs: Sequence[float], vals: Sequence[float], width: float, color: Any) -> None:
    """A bar of height 0 is invisible: draw it as a thick line on the axis, so a model that
    scores 0 is seen to score 0 rather than to be missing."""
    for x, v in zip(xs, vals):
        if v == 0:
            ax.hlines(0, x - width / 2, x + width / 2, colors=[color], lw=3, zorder=3, clip_on=False)


@plain_text
def grouped_bars(comp: Dict[str, Any], breakdown: str, stat: str, title: str, ylabel: str,
                 out_dir: str, name: str, horizontal_labels: bool = True, ylim: Optional[Tuple[float, float]] = None
                 ) -> List[str]:
    """One bar per model and group with CI error bars; chance as a black tick per group (the
    groups' own chance, else the metric's registered chance for ``stat``)."""
    groups = _groups(comp, breakdown)
    if not groups:
        return []
    series = _series(comp, breakdown, stat, groups)
    n = len(series)
    width = 0.8 / n
    fig, ax = pyplot().subplots(figsize=(6.4 if len(groups) * n <= 24 else 10, 3.8))
    for i, (model, vals, lo, hi) in enumerate(series):
        xs = [g + (i - (n - 1) / 2) * width for g in range(len(groups))]
        bars = ax.bar(xs, vals, width, yerr=[lo, hi], capsize=2, label=legend_label(model), error_kw={"lw": 0.8})
        _draw_zeros(ax, xs, vals, width, bars.patches[0].get_facecolor() if bars.patches else None)
    chance = _chance(comp, breakdown, groups)
    if not chance and stat in report_spec(comp.get("metric")).chance:
        chance = [report_spec(comp.get("metric")).chance[stat]] * len(groups)
    if chance:
        for g, c in enumerate(chance):
            ax.hlines(c, g - 0.45, g + 0.45, colors="black", linestyles="--", lw=1,
                      label="chance" if g == 0 else None)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if ylim:
        ax.set_ylim(*ylim)
    # the legend to the right: it never meets the group labels below, wrapped or rotated
    ax.legend(fontsize=8, frameon=False, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    _category_ticks(fig, ax, groups, rotate=not horizontal_labels)
    return _save(fig, out_dir, name)


@plain_text
def lines_with_ci(comp: Dict[str, Any], breakdown: str, stat: str, title: str, xlabel: str, ylabel: str,
                  out_dir: str, name: str, band: bool) -> List[str]:
    """One line per model over ordered groups (turns, instruction counts: a line joins points on a
    scale, so categories go to ``grouped_bars``); CI as a band or as error bars."""
    groups = _groups(comp, breakdown)
    if not groups:
        return []
    fig, ax = pyplot().subplots(figsize=(6.4, 3.8))
    xs = list(range(len(groups)))
    series = _series(comp, breakdown, stat, groups)
    for i, (model, vals, lo, hi) in enumerate(series):
        if band:
            line, = ax.plot(xs, vals, marker="o", ms=3, label=legend_label(model))
            ax.fill_between(xs, [v - e for v, e in zip(vals, lo)], [v + e for v, e in zip(vals, hi)],
                            color=line.get_color(), alpha=0.2, lw=0)
        else:  # a small offset per model keeps overlapping error bars apart
            shift = (i - (len(series) - 1) / 2) * min(0.08, 0.4 / max(len(series), 1))
            ax.errorbar([x + shift for x in xs], vals, yerr=[lo, hi], marker="o", ms=4, capsize=3,
                        label=legend_label(model))
    if len(xs) == 1:
        ax.set_xlim(-0.5, 0.5)
    ax.set_xticks(xs)
    ax.set_xticklabels(groups)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_ylim(0, 1.02)
    ax.set_title(title)
    _legend_below(ax, len(series) + 1)
    return _save(fig, out_dir, name)


@plain_text
def headline_bars(comp: Dict[str, Any], stat: str, label: str, out_dir: str, name: str,
                  chance_key: Optional[str] = None, chance_per_group: Optional[Tuple[str, float]] = None
                  ) -> List[str]:
    """One bar per model with its interval (none where the table has none); chance as a dashed
    line: the models' ``extra[chance_key]``, or ``chance_per_group`` = (breakdown, chance of
    one group) times the groups scored (an MME total: 75 per subtask). A note on the number
    (a subsample's missing subtasks) goes under the title."""
    fig, ax = pyplot().subplots(figsize=(max(3.5, 1.5 * len(comp["models"]) + 1.5), 3.4))
    names, vals, lo, hi = [], [], [], []
    for m in comp["models"]:
        cell = m["headline"].get(stat) or {}
        v = cell.get("value")
        if v is None:
            continue
        names.append(m["name"])
        vals.append(v)
        lo.append(float("nan") if cell.get("low") is None else max(v - cell["low"], 0.0))
        hi.append(float("nan") if cell.get("high") is None else max(cell["high"] - v, 0.0))
    ax.bar(range(len(vals)), vals, yerr=[lo, hi], capsize=3, color=[f"C{i}" for i in range(len(vals))])
    for i, v in enumerate(vals):
        _draw_zeros(ax, [i], [v], 0.8, f"C{i}")
    chances: List[float] = []
    if chance_key:
        chances = [m["extra"].get(chance_key) for m in comp["models"] if m["extra"].get(chance_key) is not None]
    elif chance_per_group:
        breakdown, per = chance_per_group
        chances = [per * len(m["breakdowns"].get(breakdown, {})) for m in comp["models"]
                   if m["breakdowns"].get(breakdown)]
    if chances:
        ax.axhline(sum(chances) / len(chances), color="black", ls="--", lw=1, label="chance")
        ax.legend(fontsize=7, frameon=False)
    notes = sorted({str(m["headline"][stat]["note"]) for m in comp["models"]
                    if (m["headline"].get(stat) or {}).get("note")})
    _model_ticks(ax, names)
    ax.set_ylabel(label)
    ax.set_title(f"{comp['benchmark']} {label}".strip() + "".join(f"\n({n})" for n in notes),
                 fontsize=10 if notes else None)
    return _save(fig, out_dir, name)


@plain_text
def instability_bars(comp: Dict[str, Any], out_dir: str) -> List[str]:
    rows = [(m["name"], m["extra"]["instability"]) for m in comp["models"] if "instability" in m["extra"]]
    if not rows:
        return []
    fig, ax = pyplot().subplots(figsize=(max(3.5, 1.5 * len(rows) + 1.5), 3.4))
    ax.bar(range(len(rows)), [v for _, v in rows], color=[f"C{i}" for i in range(len(rows))])
    _model_ticks(ax, [n for n, _ in rows])
    ax.set_ylabel("instability (mean entropy, nats)")
    ax.set_title("Answer instability across duplicates")
    return _save(fig, out_dir, "instability")


@plain_text
def pif_n_k(comp: Dict[str, Any], out_dir: str) -> List[str]:
    """PIF-N-K against K per model (only when N > 1 responses were sampled)."""
    series = []
    for m in comp["models"]:
        keys = [k for k in m["headline"] if k.startswith("pif_") and k.split("_")[-1].isdigit()
                and not k.startswith("pif_iqr")]
        ks = sorted(keys, key=lambda k: int(k.split("_")[-1]))
        if len(ks) > 1:
            series.append((m["name"], ks, m))
    if not series:
        return []
    fig, ax = pyplot().subplots(figsize=(6.4, 3.8))
    for name, ks, m in series:
        xs = [int(k.split("_")[-1]) for k in ks]
        vals = [m["headline"][k]["value"] for k in ks]
        nan = float("nan")  # no interval: no error bar
        lo = [nan if m["headline"][k]["low"] is None else max(v - m["headline"][k]["low"], 0) for k, v in zip(ks, vals)]
        hi = [nan if m["headline"][k]["high"] is None else max(m["headline"][k]["high"] - v, 0) for k, v in zip(ks, vals)]
        ax.errorbar(xs, vals, yerr=[lo, hi], marker="o", ms=4, capsize=3, label=legend_label(name))
        ax.set_xticks(xs)
    n = ks[-1].split("_")[1]
    ax.set_xlabel("K (at least K of N responses follow every instruction)")
    ax.set_ylabel(f"PIF-{n}-K")
    ax.set_ylim(0, 1.02)
    ax.set_title(f"PIF-{n}-K")
    _legend_below(ax, len(series))
    return _save(fig, out_dir, "pif_n_k")


@plain_text
def make_plots(comp: Dict[str, Any], runs: Sequence[Dict[str, Any]], out_dir: str) -> List[str]:
    """Every plot the benchmark calls for; returns the written paths (PNG and SVG)."""
    family = comp["family"]
    files: List[str] = []
    if family == "accuracy":
        names = set(_groups_names(comp))
        if "complexity" in names:  # levels and identification tasks are categories, not points on a scale
            files += grouped_bars(comp, "complexity", "accuracy", "iWISDM accuracy by complexity", "accuracy",
                                  out_dir, "iwisdm_complexity", ylim=(0, 1.05))
        if "features" in names:
            files += grouped_bars(comp, "features", "accuracy", "Accuracy by feature group", "accuracy",
                                  out_dir, "iwisdm_feature_group", ylim=(0, 1.05))
        if "response_type" in names:
            files += grouped_bars(comp, "response_type", "accuracy", "Accuracy by response type", "accuracy",
                                  out_dir, "iwisdm_response_type", ylim=(0, 1.05))
        files += headline_bars(comp, "accuracy", "accuracy", out_dir, "accuracy", chance_key="chance")
    elif family == "mme":
        files += grouped_bars(comp, "subtask", "score", "MME score per subtask (acc + acc+, max 200)", "score",
                              out_dir, "mme_subtasks", horizontal_labels=False, ylim=(0, 205))
        chance = report_spec(comp.get("metric")).chance.get("score")
        files += headline_bars(comp, "total_score", "total score", out_dir, "mme_total",
                               chance_per_group=("subtask", chance) if chance is not None else None)
    elif family == "pif":
        files += lines_with_ci(comp, "turn", "pif", "PIF by turn", "turn", "PIF", out_dir, "pif_by_turn", band=True)
        files += lines_with_ci(comp, "num_instructions", "pif", "PIF by number of instructions",
                               "instructions given", "PIF", out_dir, "pif_by_num_instructions", band=False)
        files += pif_n_k(comp, out_dir)
    files += instability_bars(comp, out_dir)
    return files


def _groups_names(comp: Dict[str, Any]) -> List[str]:
    out: List[str] = []
    for m in comp["models"]:
        out += [n for n in m["breakdowns"] if n not in out]
    return out
