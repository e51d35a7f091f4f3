"""Escaping by context: hostile model names, group names and questions cannot change the shape
of report.html (its JSON data element parses back to the same data), of comparison.md and
results.md (every table keeps its rows and columns, no heading or raw HTML is added), or crash
the plots (names are drawn as plain text, never mathtext)."""
from __future__ import annotations

import json
import os
from html.parser import HTMLParser

from tests.report_fixtures import iwisdm_records, mme_records, run
from reform_eval.evaluation.reporting.compare import tables
from reform_eval.evaluation.reporting.report import compare_runs
from reform_eval.evaluation.reporting.html import fill_template, safe_json, sample_data
from reform_eval.utils.report import markdown_table, md_cell, metrics_report

#: strings that end or bend a <script> element, a JS line, a markdown row or a mathtext parse
HOSTILE = ["<!--<script>", "</script><b>x</b>", "]]>", "a\u2028b\u2029c", "`code` | pipe", "x\n# heading",
           "{{DATA}}", "$\\frac{1}{$", "&amp; <i>", "back\\|slash", "lone \ud800 surrogate"]
MODEL_A = "m|x\n# heading <b>bold</b> $\\frac{1}{$"
MODEL_B = "</script><!--`b`"


class Elements(HTMLParser):
    """Start tags seen and the text of each <script> element, as a browser's tokenizer splits them."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list = []
        self.scripts: list = []
        self._in_script = None

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        if tag == "script":
            self._in_script = [dict(attrs), ""]

    def handle_data(self, data):
        if self._in_script is not None:
            self._in_script[1] += data

    def handle_endtag(self, tag):
        if tag == "script" and self._in_script is not None:
            self.scripts.append(tuple(self._in_script))
            self._in_script = None


def hostile_runs():
    """Two iWISDM runs whose questions, predictions and breakdown groups are hostile strings."""
    runs = []
    for name, seed in ((MODEL_A, 1), (MODEL_B, 2)):
        recs = iwisdm_records(len(HOSTILE) * 2, 0.6, seed=seed)
        for i, r in enumerate(recs):
            r["question"] = HOSTILE[i % len(HOSTILE)]
            if i % 3 == 0:
                r["prediction"] = HOSTILE[(i + 1) % len(HOSTILE)]
            r["meta"]["feature_group"] = ["a|b", "$\\alpha$", "x\n## y"][i % 3]
        runs.append(run(name, recs))
    return runs


def test_safe_json_escapes_everything_html_or_js_reads():
    data = {"q": "".join(HOSTILE), "k": ["\u2028", "<", ">", "&"]}
    text = safe_json(data)
    assert not any(c in text for c in "<>&\u2028\u2029")
    assert json.loads(text) == data
    text.encode("utf-8")  # a lone surrogate is escaped, so the page can be written
    # one-pass placeholders: a value holding "{{DATA}}" is not substituted again
    assert fill_template("{{A}}|{{B}}", {"A": "{{B}}", "B": "x"}) == "{{B}}|x"


def test_report_html_data_parses_back_and_page_keeps_its_shape(tmp_path):
    runs = hostile_runs()
    comp = compare_runs(runs, str(tmp_path), n_boot=50)
    page = open(comp["files"]["report_html"], encoding="utf-8").read()
    parser = Elements()
    parser.feed(page)
    # exactly our two scripts: the data element and the page's code, both whole
    assert [a.get("id") for a, _ in parser.scripts] == ["report-data", None]
    data_text, code = parser.scripts[0][1], parser.scripts[1][1]
    assert "<" not in data_text
    expected = json.loads(json.dumps(sample_data(comp, runs)))
    assert json.loads(data_text) == expected
    assert code.strip().startswith("(function(){") and code.strip().endswith("})();")
    # the names reached the page as text: no tag of theirs, no placeholder left or refilled
    assert "b" not in parser.tags and "i" not in parser.tags
    assert "{{" not in page.replace("{{DATA}}", "")  # only the hostile question's own text remains
    assert page.count('id="report-data"') == 1
    assert len(parser.scripts) == 2 and parser.tags.count("script") == 2


def _cells(row: str) -> list:
    """A GFM table row split into cells: an escaped pipe (``\\|``) does not split."""
    assert row.startswith("|") and row.endswith("|"), row
    cells, cur, i = [], "", 1
    while i < len(row) - 1:
        if row[i] == "\\":
            cur += row[i:i + 2]
            i += 2
            continue
        if row[i] == "|":
            cells.append(cur)
            cur = ""
        else:
            cur += row[i]
        i += 1
    return cells + [cur]


def _tables_in(md: str) -> list:
    """(header cells, [row cells]) of every table in a markdown text."""
    out, lines = [], md.split("\n")
    i = 0
    while i < len(lines):
        if lines[i].startswith("|") and i + 1 < len(lines) and lines[i + 1].startswith("|---"):
            header, rows = _cells(lines[i]), []
            i += 2
            while i < len(lines) and lines[i].startswith("|"):
                rows.append(_cells(lines[i]))
                i += 1
            out.append((header, rows))
        else:
            i += 1
    return out


def test_comparison_md_tables_keep_rows_and_columns(tmp_path):
    runs = hostile_runs()
    comp = compare_runs(runs, str(tmp_path), n_boot=50, plots=False, html=False)
    md = open(tmp_path / "comparison.md", encoding="utf-8").read()
    want = tables(comp)
    got = _tables_in(md)
    assert [(len(h), [len(r) for r in rows]) for _, h, rows in want] == [
        (len(h), [len(r) for r in rows]) for h, rows in got]
    # every line is ours: the headings are the title and one per table (plus the plots list)
    headings = [ln for ln in md.split("\n") if ln.startswith("#")]
    assert len(headings) == 1 + len(want)
    assert "<b>" not in md and "</script>" not in md and "\n# heading" not in md
    # the escaped name reads back as the name (newline shown as a space)
    head_cells = got[0][1][0]
    assert head_cells[0].strip() == "m\\|x # heading &lt;b&gt;bold&lt;/b&gt; $\\\\frac{1}{$"
    # the feature groups with a pipe and a newline stay one row each
    features = next(rows for h, rows in got if h[0].strip() == "features")
    assert sorted(r[0].strip() for r in features) == ["$\\\\alpha$", "a\\|b", "x ## y"]


def test_markdown_table_and_results_report_escape_cells():
    table = markdown_table(["name", "value"], [["a|b\n# x", 1.0], ["<script>", "`c`|"], ["\\", None]])
    lines = table.split("\n")
    assert len(lines) == 5 and all(len(_cells(ln)) == 2 for ln in lines if not ln.startswith("|---"))
    assert md_cell("a|b") == "a\\|b" and md_cell("\\|") == "\\\\\\|" and md_cell("<&>") == "&lt;&amp;&gt;"
    rep = metrics_report({"metrics": {"accuracy": 0.5}, "tables": {"t\n# injected": table}}, title="x\n# y")
    assert [ln for ln in rep.split("\n") if ln.startswith("#")] == ["## x # y", "### t # injected"]


def test_mme_subtask_rows_and_hostile_model_names(tmp_path):
    runs = [run(MODEL_A, mme_records(seed=1)), run(MODEL_B, mme_records(seed=2))]
    comp = compare_runs(runs, str(tmp_path), n_boot=50, plots=False, html=False)
    got = _tables_in(open(tmp_path / "comparison.md", encoding="utf-8").read())
    assert [len(rows) for _, rows in got] == [len(rows) for _, _, rows in tables(comp)]


def test_plots_draw_mathtext_names_as_plain_text(tmp_path):
    runs = hostile_runs()
    comp = compare_runs(runs, str(tmp_path), n_boot=50, html=False)
    svgs = [p for p in comp["plots"] if p.endswith(".svg")]
    assert any("feature_group" in p for p in svgs)
    text = open(os.path.join(str(tmp_path), next(p for p in svgs if "feature_group" in p)), encoding="utf-8").read()
    # svg.fonttype none writes the labels as text: the group and model names appear as written
    assert "$\\alpha$" in text and "$\\frac{1}{$" in text
