"""report.html in a real browser (headless Chromium over the DevTools pipe): tables, plots and
sample cards render, filters and search narrow the cards to the right counts, thumbnails and
MMMT-IF checker reasons show, and the page logs no JavaScript error."""
from __future__ import annotations

import os
import re

import pytest
from PIL import Image

from tests.report_fixtures import iwisdm_records, mmmt_if_records, run
from reform_eval.evaluation.reporting.browser import Browser, find_chromium
from reform_eval.evaluation.reporting.compare import tables
from reform_eval.evaluation.reporting.report import compare_runs
from reform_eval.evaluation.reporting.html import verdict

pytestmark = pytest.mark.skipif(
    find_chromium() is None,
    reason="chromium is not installed: bash commands/install_browser.sh (the Debian package; .ci/run does it)")


def _with_images(records, directory):
    """Give each trial two frame images, stored relative to the prediction file."""
    os.makedirs(os.path.join(directory, "images"), exist_ok=True)
    for i, r in enumerate(records):
        paths = []
        for k in range(2):
            rel = f"images/{r['sample_id']}_{k}.png"
            if not os.path.exists(os.path.join(directory, rel)):
                Image.new("RGB", (224, 224), ((40 * i) % 255, 120, 60 * k)).save(os.path.join(directory, rel))
            paths.append(rel)
        r["image_paths"] = paths
    return records


def _state(b):
    return b.evaluate("window.__report.selfTest()")


def test_report_renders_filters_and_logs_no_errors(tmp_path):
    pred_dir = tmp_path / "preds"
    recs_a = _with_images(iwisdm_records(40, 0.8, seed=1), str(pred_dir))
    recs_a[3]["prediction"] = "</script><b>not markup</b>"  # must stay text, not end the data block
    recs_b = _with_images(iwisdm_records(40, 0.4, seed=2), str(pred_dir))
    runs = [run("good", recs_a), run("coin", recs_b), run("const", _with_images(iwisdm_records(40, 0.5, seed=3),
                                                                                  str(pred_dir)))]
    for r in runs:
        r["result"]["prediction_file"] = str(pred_dir / f"{r['name']}.json")
    out = tmp_path / "report"
    comp = compare_runs(runs, str(out), n_boot=100)
    page = (out / "report.html").read_text()
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page), "the report must not load anything from the network"
    n_plots = len([p for p in comp["plots"] if p.endswith(".png")])
    with Browser() as b:
        b.open((out / "report.html").as_uri())
        s = _state(b)
        assert s == {"tables": len(tables(comp)), "plots": n_plots, "cards": 25, "shown": 120, "total": 120}
        assert b.evaluate("document.querySelectorAll('#cards .card')[0].querySelectorAll('.thumbs img').length") == 2
        assert b.evaluate("document.querySelector('#cards .card .thumbs img').naturalWidth") == 112
        # click the 'coin' and 'const' chips off: only 'good' is left
        b.evaluate("document.querySelectorAll('#f-model button')[1].click();"
                   "document.querySelectorAll('#f-model button')[2].click()")
        assert _state(b)["shown"] == 40
        want = sum(verdict(p, "accuracy") == "correct" for p in runs[0]["result"]["per_sample"])
        b.evaluate("var s=document.getElementById('f-verdict'); s.value='correct';"
                   "s.dispatchEvent(new Event('change'))")
        assert _state(b)["shown"] == want and 0 < want < 40
        assert b.evaluate("Array.prototype.every.call(document.querySelectorAll('#cards .badge'),"
                          "function(e){return e.textContent==='correct';})")
        b.evaluate("var s=document.getElementById('f-verdict'); s.value=''; s.dispatchEvent(new Event('change'));"
                   "var g=document.getElementById('f-group-complexity'); g.value='medium';"
                   "g.dispatchEvent(new Event('change'))")
        assert _state(b)["shown"] == sum(1 for r in recs_a if r["meta"]["complexity"] == "medium")
        b.evaluate("var g=document.getElementById('f-group-complexity'); g.value='';"
                   "g.dispatchEvent(new Event('change'));"
                   "document.querySelectorAll('#f-model button')[1].click();"
                   "var q=document.getElementById('f-search'); q.value='not markup';"
                   "q.dispatchEvent(new Event('input'))")
        b.evaluate("new Promise(function(r){setTimeout(r,400);})")
        s = _state(b)
        assert (s["shown"], s["cards"]) == (1, 1)
        assert b.evaluate("document.querySelector('#cards .card').textContent").count("</script><b>not markup</b>") == 1
        # paging: next page of everything
        b.evaluate("var q=document.getElementById('f-search'); q.value=''; q.dispatchEvent(new Event('input'))")
        b.evaluate("new Promise(function(r){setTimeout(r,400);})")
        b.evaluate("document.querySelector('#pager button:nth-child(2)').click()")
        assert b.evaluate("document.getElementById('pager').textContent").endswith("page 2 of 4")
        shot = b.screenshot(str(tmp_path / "report.png"))
        assert b.errors() == []
    with open(shot, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_mmmt_if_cards_show_each_instruction_verdict(tmp_path):
    runs = [run("p", mmmt_if_records(seed=1)), run("q", mmmt_if_records(seed=2))]
    compare_runs(runs, str(tmp_path), n_boot=50)
    with Browser() as b:
        b.open((tmp_path / "report.html").as_uri())
        assert _state(b)["total"] == 40
        b.evaluate("var g=document.getElementById('f-group-turn'); g.value='3'; g.dispatchEvent(new Event('change'))")
        assert _state(b)["shown"] == 10
        rows = b.evaluate("Array.prototype.map.call(document.querySelector('#cards .card table.checks')"
                          ".querySelectorAll('tr'), function(r){return r.textContent;})")
        p = next(x for x in runs[0]["result"]["per_sample"] if x["sample_id"] == "c0-t03")
        assert rows == [c["instruction"] + ("followed" if c["followed"] else "not followed") + c["reason"]
                        for c in p["checks"]]
        assert b.errors() == []
