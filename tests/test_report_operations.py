"""The report shows what running the model cost (issue 19): response-cache hits and misses,
token totals and cost, throughput, and the raw response beside the scored one when reasoning
was stripped. Exact values on fixtures, read back from comparison.json and report.html."""
from __future__ import annotations

import json
import os

import pytest

from reform_eval import run_eval
from reform_eval import run_loader_eval
from reform_eval.evaluation.reporting.compare import operations
from tests.conftest import prediction_files, results_of, write_custom_dataset
from tests.test_openai_api import _Server


@pytest.fixture
def server():
    srv = _Server()
    srv.usage = {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13}
    yield srv
    srv.close()


def _report_of(pred: str) -> tuple:
    res = results_of(pred)
    report = res["results_files"]["json"][:-len(".results.json")] + ".report"
    with open(os.path.join(report, "comparison.json")) as f:
        comp = json.load(f)
    with open(os.path.join(report, "report.html"), encoding="utf-8") as f:
        page = f.read()
    return comp, page


def test_report_shows_cache_hits_tokens_and_cost(tmp_path, server, monkeypatch):
    monkeypatch.delenv("REFORM_NO_CACHE", raising=False)
    cfg = write_custom_dataset(str(tmp_path / "data"), n=4, formulation="Generation")
    base = ["--model", "openai_api", "--model_name", "gpt-test", "--model_option", f"base_url={server.url}",
            "--model_option", "prompt_price=2.5", "--model_option", "completion_price=10",
            "--dataset_name", "custom", "--dataset_config", cfg, "--formulation", "Generation",
            "--cache_dir", str(tmp_path / "cache"), "--do_eval"]
    assert run_eval.main([*base, "--output_dir", str(tmp_path / "cold")]) == 0
    assert run_eval.main([*base, "--output_dir", str(tmp_path / "warm")]) == 0
    assert len(server.requests) == 4  # the warm run asked the cache only
    cold, page = _report_of(prediction_files(tmp_path / "cold")[0])
    ops = cold["models"][0]["operations"]
    # 4 calls of 10 prompt + 3 completion tokens; cost = 40 * 2.5 / 1e6 + 12 * 10 / 1e6
    assert {k: ops[k] for k in ("cache_hits", "cache_misses", "prompt_tokens", "completion_tokens", "cost",
                                "generated_tokens")} == {"cache_hits": 0, "cache_misses": 4, "prompt_tokens": 40,
                                                         "completion_tokens": 12, "cost": 0.00022,
                                                         "generated_tokens": 12}
    assert "<h3>Operations (response cache, tokens, throughput)</h3>" in page
    assert "<th>cache hits</th><th>cache misses</th><th>prompt tokens</th><th>completion tokens</th>" in page
    assert "<td>0</td><td>4</td><td>40</td><td>12</td>" in page
    warm, page = _report_of(prediction_files(tmp_path / "warm")[0])
    ops = warm["models"][0]["operations"]
    # every answer came from the cache: this run spent no tokens and no money
    assert ops == {"cache_hits": 4, "cache_misses": 0, "prompt_tokens": 0, "completion_tokens": 0, "cost": 0.0}
    assert "<td>4</td><td>0</td>" in page
    warm_recs = json.load(open(prediction_files(tmp_path / "warm")[0]))
    assert all("usage" not in r and r["cached_responses"] == 1 and r["cached_usage"]["prompt_tokens"] == 10
               for r in warm_recs)
    # the same command again reuses the file: its results keep the run's cache hits
    assert run_eval.main([*base, "--output_dir", str(tmp_path / "warm")]) == 0
    again, _ = _report_of(prediction_files(tmp_path / "warm")[0])
    assert again["models"][0]["operations"] == ops
    report_dir = os.path.dirname(results_of(prediction_files(tmp_path / "warm")[0])["results_files"]["json"])
    md = [open(os.path.join(root, "comparison.md")).read() for root, _, files in os.walk(report_dir)
          if "comparison.md" in files]
    assert len(md) == 1 and "| model | cache hits | cache misses | prompt tokens |" in md[0]


def test_comparison_md_and_report_show_raw_and_stripped_responses(tmp_path):
    cfg = write_custom_dataset(str(tmp_path / "data"), n=4, formulation="Generation")
    assert run_eval.main(["--model", "random", "--dataset_name", "custom", "--dataset_config", cfg,
                          "--formulation", "Generation", "--output_dir", str(tmp_path / "out")]) == 0
    (pred,) = prediction_files(tmp_path / "out")
    recs = json.load(open(pred))
    for r in recs[:3]:  # three responses think aloud first; the fourth answers plainly
        r["prediction"] = f"<think>Could it be purple? No.</think> {r['answer']}"
    recs[3]["prediction"] = str(recs[3]["answer"])
    json.dump(recs, open(pred, "w"))
    other = str(tmp_path / "plain.json")
    json.dump([dict(r, prediction=str(r["answer"])) for r in recs], open(other, "w"))
    assert run_loader_eval.main(["--prediction_file", pred, other, "--output_dir", str(tmp_path / "cmp"),
                                 "--strip_reasoning"]) == 0
    comp = json.load(open(tmp_path / "cmp" / "comparison.json"))
    # --output_dir holds every file's results; nothing is written beside the inputs
    assert len([n for n in os.listdir(tmp_path / "cmp") if n.endswith(".results.json")]) == 2
    assert not [n for n in os.listdir(tmp_path / "out") if ".scored-" in n]
    assert not [n for n in os.listdir(tmp_path) if ".scored-" in n]
    assert [m["operations"] for m in comp["models"]] == [{"reasoning_stripped": 3}, {}]
    md = open(tmp_path / "cmp" / "comparison.md").read()
    assert "| model | responses with reasoning stripped |" in md
    page = open(tmp_path / "cmp" / "report.html", encoding="utf-8").read()
    blob = page.split('<script id="report-data" type="application/json">', 1)[1].split("</script>", 1)[0]
    data = json.loads(blob)
    strings = data["strings"]
    raws = [strings[r[8]] if r[8] >= 0 else None for r in data["results"]]
    responses = [strings[r[3]] for r in data["results"]]
    answers = [str(r["answer"]) for r in recs]
    # model 0: the scored (stripped) answer and, beside it, the raw text with its reasoning
    assert responses[:4] == answers
    assert raws[:4] == [f"<think>Could it be purple? No.</think> {a}" for a in answers[:3]] + [None]
    assert raws[4:] == [None] * 4  # nothing was stripped from the plain run
    assert 'kv("raw response"' in page


def test_operations_table_absent_when_nothing_was_recorded():
    run = {"name": "m", "records": [{"sample_id": "a", "dup_index": 0, "prediction": "x"}],
           "result": {"per_sample": [{"sample_id": "a", "dup_index": 0, "prediction": "x", "correct": True}]}}
    assert operations(run) == {}
