"""``run_loader_eval --explain A B`` (evaluation.reporting.explain): every recorded difference
between two runs, and which of them touch each flipped sample.

Known answers first, on hand-written records (exact flips, attribution and summary line; pairing
by item and by question; a foreign run without traces; malformed files refused in one line).
Then real runs of the tiny LLaVA models that differ in one factor each (system line, option
marks, image size, BOS, parse mode, dtype), where the explanation must name exactly that factor
and nothing else, and two identical runs, which must give "no difference" and 0 flips. The
trained model may be re-shipped, so flip counts are asserted only where they are structural.
"""
from __future__ import annotations

import json
import os

import pytest
from PIL import Image

from reform_eval import run_loader_eval
from reform_eval.build.mme_synthetic import write_yesno_release
from reform_eval.evaluation import (DatasetConfig, GenerationConfig, ModelConfig, OutputConfig, RunConfig, ScoringConfig,
                        evaluate, score)
from reform_eval.evaluation.reporting.explain import explain_runs, format_explanation
from reform_eval.evaluation.reporting.explain_factors import factor_of, run_facts
from reform_eval.evaluation.reporting.explain_files import explain_files
from reform_eval.metrics import evaluate as score_metrics
from reform_eval.utils.errors import ReformError


# -- known answers on hand-written records -------------------------------------------------------------
def _rec(i, prediction, prompt="p", pixels="x", marks=("A", "B"), item=None, trace=True, meta=None):
    r = {"sample_id": f"s{i}", "dup_index": 0, "benchmark": "custom", "formulation": "SingleChoice",
         "inference_method": "generation", "question": f"Which colour is picture {i}?",
         "answer_options": ["red", "blue"], "answer": 0, "option_marks": list(marks), "prediction": prediction,
         "item_sha": item or f"item{i}", "prompt_sha": f"pre-{prompt}", "meta": meta or {"n": i}}
    if trace:
        r["trace"] = {"prompt_sha": prompt, "prompt_tokens": 10, "bos": True, "pixel_sha": pixels,
                      "image_sizes": [[32, 32]]}
    return r


def _run(name, records, info):
    result = score_metrics(records, "SingleChoice", "generation")
    result.update(formulation="SingleChoice", infer_method="generation", prediction_file=f"/x/{name}.json")
    return {"name": name, "records": records, "result": result, "info": info}


INFO_A = {"config": {"model": "llava", "model_option": [], "output_dir": "/out/a", "option_mark": "upper"},
          "provenance": {"dtype": "float32", "system_line": "", "image_processor": {"class": "P", "backend": "pil"},
                         "prompt_example": "USER: a"},
          "versions": {"torch": "2.13.0"}, "run_id": "aaa", "timing": {"total_s": 3.0}}
INFO_B = {"config": {"model": "llava", "model_option": ["dtype=bfloat16", "system_msg=Be brief."],
                     "output_dir": "/out/b", "option_mark": "upper"},
          "provenance": {"dtype": "bfloat16", "system_line": "Be brief.",
                         "image_processor": {"class": "P", "backend": "torchvision"}, "prompt_example": "USER: b"},
          "versions": {"torch": "2.13.0"}, "run_id": "bbb", "timing": {"total_s": 9.0}}


def _engine_rec(i, prediction, pixels, images):
    """A record of an engine that cannot see the pixel tensor (vLLM, a server) when ``pixels`` is
    None: its images by content only (``image_sha``)."""
    r = _rec(i, prediction, pixels=pixels)
    r["trace"]["image_sha"] = images
    if pixels is None:
        r["trace"]["image_sizes"] = None
    return r


@pytest.mark.parametrize("backend_b,images_b,pixels,touched", [
    ("pil", "img", False, ["dtype"]),
    ("torchvision", "img", True, ["image processor backend", "dtype"]),
    ("pil", "other", True, ["pixels (their cause is not recorded)", "dtype"])])
def test_pixels_compare_by_image_content_where_one_engine_cannot_see_the_tensor(backend_b, images_b, pixels,
                                                                               touched):
    """In process (the pixel tensor's hash) against vLLM (pixel_sha unknown: the engine's tensors
    are not exposed): the same images processed the same way are the same pixels, so a flip is
    "only different settings"; other images, or the same images processed another way (a run-level
    pixel factor), are other pixels, attributed to what differs."""
    info_b = json.loads(json.dumps(INFO_A))
    info_b["provenance"]["image_processor"]["backend"] = backend_b
    info_b["provenance"]["dtype"] = "bfloat16"
    a = _run("A", [_engine_rec(0, "A", "x", "img")], INFO_A)
    b = _run("B", [_engine_rec(0, "B", None, images_b)], info_b)
    (flip,) = explain_runs(a, b)["flips"]
    assert flip["pixels_differ"] is pixels and flip["prompt_differs"] is False
    assert flip["touched_by"] == touched
    # without the images' content on one side nothing is known (never read as equal)
    b_old = _run("B", [_rec(0, "B", pixels=None)], info_b)
    (flip,) = explain_runs(a, b_old)["flips"]
    assert flip["pixels_differ"] is None


def test_each_flip_is_attributed_to_what_touches_it():
    a = _run("A", [_rec(0, "A"), _rec(1, "B"), _rec(2, "A"), _rec(3, "A")], INFO_A)
    b = _run("B", [_rec(0, "B"), _rec(1, "A", prompt="q"), _rec(2, "B", pixels="y"), _rec(3, "A")], INFO_B)
    exp = explain_runs(a, b)
    assert {d["factor"]: (d["a"], d["b"]) for d in exp["differences"]} == {
        "dtype": ("'float32'", "'bfloat16'"), "system line": ("''", "'Be brief.'"),
        "image processor backend": ("'pil'", "'torchvision'")}  # not output_dir, run_id, timing, prompt_example
    flips = {f["sample_id"]: f for f in exp["flips"]}
    assert sorted(flips) == ["s0", "s1", "s2"]
    assert flips["s0"]["touched_by"] == ["dtype"]
    assert flips["s1"]["touched_by"] == ["system line", "dtype"]
    assert flips["s2"]["touched_by"] == ["image processor backend", "dtype"]
    assert (flips["s1"]["a"], flips["s1"]["b"], flips["s1"]["answer_a"], flips["s1"]["answer_b"]) == \
        ("wrong", "right", "blue", "red")
    assert exp["summary"] == ("accuracy moved by -0.2500 (0.7500 to 0.5000): 3 verdicts changed (1 to right, 2 to "
                              "wrong: -1 of 4 paired samples); 1 of them have different prompts, 1 different pixels, "
                              "1 only different settings")
    text = format_explanation(exp)
    assert text.splitlines()[-1] == exp["summary"] and "no difference" not in text


def test_identical_runs_say_no_difference():
    recs = [_rec(0, "A"), _rec(1, "B")]
    exp = explain_runs(_run("A", recs, INFO_A), _run("B", [dict(r) for r in recs], dict(INFO_A, run_id="other")))
    assert exp["differences"] == [] and exp["flips"] == [] and exp["no_difference"]
    text = format_explanation(exp)
    assert "no difference" in text
    assert text.splitlines()[-1] == ("accuracy moved by +0.0000 (0.5000 to 0.5000): 0 verdicts changed (0 to right, "
                                     "0 to wrong: +0 of 2 paired samples); 0 of them have different prompts, "
                                     "0 different pixels, 0 only different settings")


def test_pairs_by_item_or_by_question_never_by_position():
    """Other marks change the item's content hash, yet it is the same question: paired, and the
    marks are named from the records; an id holding another question is never paired."""
    a = _run("A", [_rec(0, "A"), _rec(1, "A"), _rec(2, "A")], INFO_A)
    b = _run("B", [_rec(2, "a", marks=("a", "b"), item="other2", prompt="q"),
                   _rec(1, "b", marks=("a", "b"), item="other1", prompt="q"),
                   _rec(0, "a", item="x0", meta={"n": "another trial"})],
             dict(INFO_A, config=dict(INFO_A["config"], option_mark="lower")))
    exp = explain_runs(a, b)
    assert (exp["n_pairs"], exp["paired_by_item"], exp["paired_by_question"], exp["refused"]) == (2, 0, 2, 1)
    assert [d["factor"] for d in exp["differences"]] == ["option marks"]
    assert [(f["sample_id"], f["touched_by"]) for f in exp["flips"]] == [("s1", ["option marks"])]
    # the headline moved by each run's own accuracy (3/3 to 2/3); the paired part and the rest are named
    assert (exp["moved"], exp["moved_paired"]) == (pytest.approx(-1 / 3), -0.5)
    assert exp["summary"].endswith("; on the 2 paired samples it moved by -0.5000, the rest by the samples not paired "
                                   "(1 shared id holding other content (another question, options or images), "
                                   "0 only in A, 0 only in B)")


def test_a_foreign_run_without_traces_is_explained_by_what_it_records():
    """A reader of another harness's log gives records (no trace; a prompt hash where it knows
    the text) and the provenance it knows: what only one run records is listed apart, and a flip
    with no hash to compare is 'unknown', never 'only settings'."""
    ours = _run("ours", [_rec(0, "A"), _rec(1, "A")], INFO_A)
    theirs = [_rec(0, "B", prompt="other", trace=False), _rec(1, "B", trace=False)]
    del theirs[1]["prompt_sha"]  # and a trace whose every field is unknown (null): never read as equal or not
    theirs[1]["trace"] = {"prompt_sha": None, "prompt_tokens": None, "bos": None, "pixel_sha": None}
    for r in ours["records"] + theirs:
        r["image_ids"] = [f"{r['sample_id']}.png"]
    exp = explain_runs(ours, _run("lmms-eval", theirs, {"provenance": {"engine": "lmms-eval", "system_line": "Hi."}}))
    assert [d["factor"] for d in exp["differences"]] == ["system line"]
    assert {d["factor"] for d in exp["recorded_by_one_run"]} >= {"dtype", "image processor", "model family"}
    assert exp["counts"] == {"prompt": 1, "pixels": 0, "settings": 0, "unknown": 1, "to_right": 0, "to_wrong": 2,
                             "answers": 0}
    assert exp["summary"].endswith("0 only different settings, 1 unknown (no trace or prompt hash to tell)")


def test_factor_names_and_what_is_ignored():
    facts, _ = run_facts({**INFO_B, "metric_options": {"mme_parse": "word"}, "likelihood_reduction": "mean"})
    named = {k: factor_of(k) for k in facts}
    assert named["config.model_option.system_msg"] == ("system line", "prompt")
    assert named["provenance.image_processor.backend"] == ("image processor backend", "pixels")
    assert named["scoring.metric_options.mme_parse"] == ("parse mode", "settings")
    assert named["scoring.likelihood_reduction"] == ("likelihood reduction", "settings")
    assert named["versions.torch"] == ("torch version", "settings")
    assert named["config.output_dir"] is None and named["provenance.prompt_example"] is None
    assert "run_id" not in facts and "timing.total_s" not in facts


def _write_results(path, **info):
    with open(path, "w") as f:
        json.dump(info, f)


@pytest.mark.parametrize("field,value,shown", [("metric_options", "word", "metric_options"),
                                               ("infer_method", 3, "infer_method"),
                                               ("config", {"model_option": "dtype=x"}, "config.model_option"),
                                               ("provenance", [1], "provenance")])
def test_a_malformed_results_file_is_refused_in_one_line(tmp_path, capsys, field, value, shown):
    recs = [{**_rec(0, "A"), "trace": None}]
    pred = tmp_path / "a.json"
    pred.write_text(json.dumps(recs))
    good = tmp_path / "b.json"
    good.write_text(json.dumps(recs))
    _write_results(tmp_path / "a.results.json", prediction_file=str(pred), **{field: value})
    assert run_loader_eval.main(["--explain", str(tmp_path / "a.results.json"), str(good)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "a.results.json" in err[0] and shown in err[0], err


def test_explain_refuses_scoring_flags_and_a_run_against_itself(tmp_path, capsys):
    pred = tmp_path / "a.json"
    pred.write_text(json.dumps([_rec(0, "A")]))
    assert run_loader_eval.main(["--explain", str(pred), str(pred), "--mme_parse", "word"]) == 2
    assert "leave out --mme_parse" in capsys.readouterr().err
    assert run_loader_eval.main(["--explain", str(pred), str(pred)]) == 2
    assert "the same run" in capsys.readouterr().err


# -- real runs that differ in one factor -------------------------------------------------------------------
N_TRIALS = 12


def _evaluate(out, model_options=None, method="likelihood", option_mark="upper", dataset="iWISDM",
              config="iwisdm_identify_category", options=None, formulation="SingleChoice", name="tiny-trained",
              metric_options=None):
    cfg = RunConfig(model=ModelConfig("llava", name, options=dict(model_options or {})),
                    dataset=DatasetConfig(dataset, formulation=formulation, config=config, option_mark=option_mark,
                                          options=options if options is not None else {"n_trials": N_TRIALS}),
                    generation=GenerationConfig(infer_method=method, batch_size=6, max_new_tokens=6),
                    scoring=ScoringConfig(do_eval=True, metric_options=dict(metric_options or {})),
                    output=OutputConfig(output_dir=str(out), use_cache=False))
    return evaluate(cfg)


def _explain(a, b):
    exp = explain_files(a, b, quiet=True)
    return exp, [d["factor"] for d in exp["differences"]]


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    """tiny-trained identifying iWISDM categories by likelihood (the run most pairs start from)."""
    return _evaluate(tmp_path_factory.mktemp("baseline"))


@pytest.mark.slow
def test_system_line(baseline, tmp_path, capsys):
    other = _evaluate(tmp_path, {"system_msg": "You are a careful assistant. Answer briefly."})
    exp, factors = _explain(baseline.prediction_file, other.prediction_file)
    assert factors == ["system line"]
    assert exp["n_pairs"] == exp["paired_by_item"] == N_TRIALS
    assert all(f["prompt_differs"] is True and f["pixels_differ"] is False and f["touched_by"] == ["system line"]
               for f in exp["flips"])
    n = len(exp["flips"])
    assert exp["summary"].endswith(f"{n} verdict{'' if n == 1 else 's'} changed ({exp['counts']['to_right']} to right, "
                                   f"{exp['counts']['to_wrong']} to wrong: {exp['counts']['to_right'] - exp['counts']['to_wrong']:+d} "
                                   f"of {N_TRIALS} paired samples); {n} of them have different prompts, 0 different "
                                   "pixels, 0 only different settings")
    assert exp["moved"] == pytest.approx((exp["counts"]["to_right"] - exp["counts"]["to_wrong"]) / N_TRIALS)
    # the command line prints the same, its last line the summary
    assert run_loader_eval.main(["--explain", baseline.prediction_file, other.prediction_file]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-1] == exp["summary"] and any(line.lstrip().startswith("system line") for line in out)


@pytest.mark.slow
def test_bos(baseline, tmp_path):
    other = _evaluate(tmp_path, {"add_bos": False})
    exp, factors = _explain(baseline.prediction_file, other.prediction_file)
    assert factors == ["BOS"]
    a, b = (json.load(open(p)) for p in (baseline.prediction_file, other.prediction_file))
    assert all(r["trace"]["bos"] is True for r in a) and all(r["trace"]["bos"] is False for r in b)
    assert [r["trace"]["prompt_tokens"] - 1 for r in a] == [r["trace"]["prompt_tokens"] for r in b]
    assert [r["trace"]["prompt_sha"] for r in a] == [r["trace"]["prompt_sha"] for r in b]  # the same text
    assert json.load(open(other.results_files["json"]))["provenance"]["adds_bos"] is False
    assert all(f["prompt_differs"] and f["touched_by"] == ["BOS"] for f in exp["flips"])


@pytest.mark.slow
def test_dtype(baseline, tmp_path):
    other = _evaluate(tmp_path, {"dtype": "bfloat16"})
    exp, factors = _explain(baseline.prediction_file, other.prediction_file)
    assert factors == ["dtype"]
    assert all(f["prompt_differs"] is False and f["pixels_differ"] is False for f in exp["flips"])
    assert exp["counts"]["settings"] == len(exp["flips"])


@pytest.mark.slow
def test_identical_runs(baseline, tmp_path):
    again = _evaluate(tmp_path)
    exp, factors = _explain(baseline.prediction_file, again.prediction_file)
    assert factors == [] and exp["recorded_by_one_run"] == [] and exp["no_difference"]
    assert exp["summary"] == ("accuracy moved by +0.0000 (1.0000 to 1.0000): 0 verdicts changed (0 to right, 0 to "
                              "wrong: +0 of 12 paired samples); 0 of them have different prompts, 0 different pixels, "
                              "0 only different settings")
    # a comparison of the two runs carries the same explanation as a section
    comp = score([baseline.prediction_file, again.prediction_file], output_dir=str(tmp_path / "cmp"),
                 quiet=True).comparison
    assert comp["explain"]["summary"] == exp["summary"]
    md = open(os.path.join(str(tmp_path / "cmp"), "comparison.md")).read()
    assert "## Explanation: differences between A" in md and "no difference" in md and exp["summary"] in md
    assert exp["summary"] in open(os.path.join(str(tmp_path / "cmp"), "report.html")).read()


@pytest.mark.slow
def test_option_marks(tmp_path):
    """Generation, where the marks are in the prompt and in the parser: other marks are another
    item's content, yet the same question, so the runs pair by question."""
    upper = _evaluate(tmp_path / "upper", method="generation")
    lower = _evaluate(tmp_path / "lower", method="generation", option_mark="lower")
    exp, factors = _explain(upper.prediction_file, lower.prediction_file)
    assert factors == ["option marks"]
    assert exp["n_pairs"] == exp["paired_by_question"] == N_TRIALS
    assert all(f["prompt_differs"] and f["touched_by"] == ["option marks"] for f in exp["flips"])


def _write_at_size(directory, size):
    """The same eight pictures and questions, drawn at ``size`` pixels (file names alike)."""
    os.makedirs(directory, exist_ok=True)
    colours = {"red": (220, 30, 30), "green": (30, 200, 30), "blue": (30, 30, 220), "yellow": (230, 220, 30)}
    lines = []
    for i in range(8):
        colour = list(colours)[i % 4]
        img = Image.new("RGB", (size, size), (30, 30, 30))
        img.paste(colours[colour], (size // 4, size // 4, 3 * size // 4 + i % 3, 3 * size // 4))
        img.save(os.path.join(directory, f"img{i}.png"))
        lines.append(json.dumps({"sample_id": f"q{i}", "images": [f"img{i}.png"], "question": "Which colour is the square?",
                                 "answer_options": list(colours), "answer": i % 4}))
    with open(os.path.join(directory, "items.jsonl"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(directory, "custom.yaml"), "w") as f:
        f.write("data_file: items.jsonl\n")
    return os.path.join(directory, "custom.yaml")


@pytest.mark.slow
def test_image_size(tmp_path):
    runs = [_evaluate(tmp_path / f"out{size}", dataset="custom", config=_write_at_size(str(tmp_path / f"d{size}"), size),
                      options={}) for size in (48, 160)]
    exp, factors = _explain(*(r.prediction_file for r in runs))
    assert factors == ["image size"]
    assert exp["n_pairs"] == exp["paired_by_question"] == 8
    sizes = [[r["trace"]["image_sizes"] for r in json.load(open(run.prediction_file))] for run in runs]
    assert sizes == [[[[48, 48]]] * 8, [[[160, 160]]] * 8]
    a, b = (json.load(open(run.prediction_file)) for run in runs)
    assert all(x["trace"]["pixel_sha"] != y["trace"]["pixel_sha"] for x, y in zip(a, b))  # the processor's output
    assert all(f["pixels_differ"] and not f["prompt_differs"] and f["touched_by"] == ["image size"]
               for f in exp["flips"])


@pytest.mark.slow
def test_parse_mode(tmp_path, capsys):
    """One MME run scored two ways: the second results file (``--mme_parse word``) is explained
    against the first; the answers are the same, so every flip is 'only different settings'."""
    root = write_yesno_release(str(tmp_path / "mme"), n_images=4, seed=3)
    kw = dict(dataset="MME", config="mme_synthetic", options={"root": root}, formulation="Generation",
              method="generation")
    first = _evaluate(tmp_path / "out", **kw)
    second = _evaluate(tmp_path / "out", metric_options={"mme_parse": "word"}, **kw)
    assert second.prediction_file == first.prediction_file and second.results_files["json"] != first.results_files["json"]
    exp, factors = _explain(first.results_files["json"], second.results_files["json"])
    assert factors == ["parse mode"] and exp["recorded_by_one_run"] == []  # the reused run keeps its provenance
    assert {d["factor"]: (d["a"], d["b"]) for d in exp["differences"]} == {"parse mode": ("'official'", "'word'")}
    assert exp["counts"]["settings"] == len(exp["flips"])
    assert " and the MME score by " in exp["summary"]
    # a prediction file scored two ways: the command line asks which results are meant
    os.rename(first.results_files["json"], first.results_files["json"][:-len(".results.json")] + ".eval-00000000.results.json")
    assert run_loader_eval.main(["--explain", first.prediction_file, second.results_files["json"]]) == 2
    assert "scored 2 ways" in capsys.readouterr().err
    with pytest.raises(ReformError, match="scored 2 ways"):
        explain_files(first.prediction_file, second.results_files["json"], quiet=True)


def test_a_comparison_of_two_runs_has_the_explanation_as_a_section(tmp_path):
    from reform_eval.evaluation.reporting.report import compare_runs
    a = _run("A", [_rec(0, "A"), _rec(1, "B")], INFO_A)
    b = _run("B", [_rec(0, "B"), _rec(1, "B")], INFO_B)
    comp = compare_runs([a, b], str(tmp_path / "two"), n_boot=20, plots=False)
    summary = ("accuracy moved by -0.5000 (0.5000 to 0.0000): 1 verdict changed (0 to right, 1 to wrong: -1 of 2 "
               "paired samples); 0 of them have different prompts, 0 different pixels, 1 only different settings")
    assert comp["explain"]["summary"] == summary
    md = open(str(tmp_path / "two" / "comparison.md")).read()
    assert "## Explanation: differences between A (A) and B (B)" in md and f"- Note: {summary}" in md
    assert "## Explanation: samples whose verdict changed (1)" in md
    page = open(str(tmp_path / "two" / "report.html")).read()
    assert summary in page and "<h3>Explanation: differences between A (A) and B (B)</h3>" in page
    c = _run("C", [_rec(0, "A"), _rec(1, "A")], INFO_A)
    three = compare_runs([a, b, c], str(tmp_path / "three"), n_boot=20, plots=False)
    assert "explain" not in three and "Explanation" not in open(str(tmp_path / "three" / "comparison.md")).read()


def test_runs_of_two_benchmarks_are_refused():
    a = _run("A", [_rec(0, "A")], INFO_A)
    other = [dict(_rec(0, "A"), benchmark="iWISDM")]
    with pytest.raises(ReformError, match="different benchmarks"):
        explain_runs(a, _run("B", other, INFO_A))


def test_a_run_rescored_by_run_loader_eval_is_explained_against_its_own_scoring(tmp_path, capsys):
    """The prediction file (scored as its run recorded: sum) against its run_loader_eval results
    (mean): the one difference is the reduction, the run-level record comes from the run's own
    results file for both, and the flip is 'only different settings'."""
    rec = {**_rec(0, 0), "inference_method": "likelihood", "candidate_logprobs": [-2.0, -1.5],
           "candidate_num_tokens": [4, 1]}  # sum picks blue (wrong), mean picks red (right)
    rec["trace"]["pixel_sha"], rec["image_ids"] = None, []  # a record that names no images
    pred = tmp_path / "run.json"
    pred.write_text(json.dumps([rec]))
    _write_results(tmp_path / "run.results.json", prediction_file=str(pred), likelihood_reduction="sum",
                   metric_options={}, **{k: INFO_A[k] for k in ("config", "provenance", "versions")})
    _write_results(tmp_path / "run.scored-0123abcd.results.json", prediction_file=str(pred),
                   likelihood_reduction="mean", metric_options={})
    exp = explain_files(str(pred), str(tmp_path / "run.scored-0123abcd.results.json"), quiet=True)
    assert [d["factor"] for d in exp["differences"]] == ["likelihood reduction"] and not exp["recorded_by_one_run"]
    assert exp["summary"] == ("accuracy moved by +1.0000 (0.0000 to 1.0000): 1 verdict changed (1 to right, 0 to "
                              "wrong: +1 of 1 paired samples); 0 of them have different prompts, 0 different pixels, "
                              "1 only different settings")
    assert run_loader_eval.main(["--explain", str(pred), str(tmp_path / "run.scored-0123abcd.results.json"),
                                 "--output_dir", str(tmp_path / "why")]) == 0
    out = capsys.readouterr().out
    assert "; scoring from run.scored-0123abcd.results.json)" in out and out.strip().splitlines()[-1] == exp["summary"]
    assert json.load(open(tmp_path / "why" / "explain.json"))["summary"] == exp["summary"]
    assert open(tmp_path / "why" / "explain.md").read().rstrip().endswith(exp["summary"])


@pytest.mark.slow
def test_against_lmms_eval_with_its_vicuna_system_line(tmp_path):
    """Our run (default settings: the checkpoint's template, no system line) against the real
    lmms-eval 0.7.3 log of the same checkpoint and data with its Vicuna system line
    (tests/data/lmms_eval_mme, docs/foreign_logs.md): its rows pair with our items by item key,
    the system line is named, and every flip is one of different prompts. Both parsed by lmms-eval's
    rule ('stripped': our run asks for it, the log's rows carry it), so parsing is no difference."""
    import glob
    from reform_eval.evaluation.reporting.compare import flips as compare_flips
    from reform_eval.evaluation.reporting.explain_files import load_run
    fixture = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "lmms_eval_mme")
    data = json.load(open(os.path.join(fixture, "MANIFEST.json")))["data"]
    root = write_yesno_release(str(tmp_path / "release"), n_images=data["images"], seed=data["seed"])
    ours = _evaluate(tmp_path / "ours", dataset="MME", config=None, formulation="Generation", method="generation",
                     options={"root": root, "subtasks": data["subtasks"], "check_counts": False, "prompt": "official"},
                     metric_options={"mme_parse": "stripped"})
    log = glob.glob(os.path.join(fixture, "vicuna", "*_samples_mme_local.jsonl"))[0]
    exp, factors = _explain(ours.prediction_file, log)
    assert exp["n_pairs"] == exp["paired_by_item_key"] == 2 * 2 * data["images"]
    assert "system line" in factors and set(factors) <= {"system line", "chat template"}
    a, b = load_run(ours.prediction_file), load_run(log)
    verdicts = {x for x, _ in compare_flips(a, b)["flips"]}
    assert {(f["sample_id"], f["dup_index"]) for f in exp["flips"]} == verdicts
    assert {(f["sample_id"], f["dup_index"]) for f in exp["answer_changes"]} == \
        {x for x, _ in compare_flips(a, b)["answer_changes"]} - verdicts
    assert exp["flips"] and all(f["prompt_differs"] is True and "system line" in f["touched_by"] for f in exp["flips"])


# -- explain and compare reconcile (issue 34) ----------------------------------------------------------

LMMS_EVAL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "lmms_eval_mme")


def test_the_committed_lmms_eval_pair_counts_verdicts_apart_from_answers():
    """Ours against lmms-eval's log with its Vicuna system line: 5 verdicts changed (all right to
    wrong) and 5 answers changed under an unchanged wrong verdict; the headline counts the 5, and
    -5 of 80 is the -0.0625 the two runs' own accuracies differ by."""
    exp = explain_files(os.path.join(LMMS_EVAL, "ours.json"), os.path.join(LMMS_EVAL, "vicuna"), quiet=True)
    assert [f["a"] != f["b"] for f in exp["flips"]] == [True] * 5
    assert [(f["a"], f["b"]) for f in exp["answer_changes"]] == [("wrong", "wrong")] * 5
    assert all(f["answer_a"] != f["answer_b"] for f in exp["answer_changes"])
    assert exp["moved"] == pytest.approx(exp["headline_b"] - exp["headline_a"]) == pytest.approx(-5 / 80)
    assert exp["summary"] == ("accuracy moved by -0.0625 (0.8875 to 0.8250) and the MME score by -27.5: 5 verdicts "
                              "changed (0 to right, 5 to wrong: -5 of 80 paired samples); 5 of them have different "
                              "prompts, 0 different pixels, 0 only different settings; 5 more answers changed without "
                              "changing a verdict")
    text = format_explanation(exp)
    assert "samples whose verdict changed (5)" in text
    assert "samples whose answer changed but not their verdict (5)" in text


def _other_items(records):
    """The same ids holding other questions (another build of a custom set)."""
    return [dict(r, item_sha="other-" + r["item_sha"], question="Another question?", meta={"n": "other"})
            for r in records]


def test_runs_sharing_no_sample_are_refused_in_one_line(tmp_path, capsys):
    from reform_eval.evaluation.reporting.explain import NothingToExplain
    recs_a = [_rec(i, "A") for i in range(3)]
    recs_b = _other_items([_rec(i, "B") for i in range(3)]) + [_rec(7, "A")]
    with pytest.raises(NothingToExplain, match=r"share no sample: 3 shared ids holding other content \(another "
                                               r"question, options or images\), 0 only in A, 1 only in B"):
        explain_runs(_run("A", recs_a, INFO_A), _run("B", recs_b, INFO_A))
    for name, recs in (("a", recs_a), ("b", recs_b)):
        (tmp_path / f"{name}.json").write_text(json.dumps(recs))
    assert run_loader_eval.main(["--explain", str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1 and "share no sample: 3 shared ids" in err


def test_a_comparison_never_tests_or_explains_pairs_that_do_not_exist(tmp_path):
    """No sample in common: the comparison says so, has no paired test and no explanation (no
    'accuracy moved by +0.0000'). Partly paired: the test covers the paired part with its n, and
    the part left out is named and counted."""
    from reform_eval.evaluation.reporting.report import compare_runs
    a = _run("A", [_rec(i, "A") for i in range(4)], INFO_A)
    none = _run("B", _other_items([_rec(i, "B") for i in range(4)]), INFO_A)
    comp = compare_runs([a, none], str(tmp_path / "none"), n_boot=20, plots=False)
    (t,) = comp["paired_tests"]
    assert (t["n_pairs"], t["test"], t["unpaired"]) == (0, None, {"other_content": 4, "only_a": 0, "only_b": 0})
    md = open(str(tmp_path / "none" / "comparison.md")).read()
    assert "accuracy moved" not in md and "share no sample: 4 shared ids holding other content" in md
    assert "they share no sample, so there is no paired test." in md
    part = _run("B", [_rec(0, "B"), _rec(1, "B")] + _other_items([_rec(2, "B")]) + [_rec(9, "A")], INFO_A)
    comp = compare_runs([a, part], str(tmp_path / "part"), n_boot=20, plots=False)
    (t,) = comp["paired_tests"]
    assert (t["n_pairs"], t["test"], t["unpaired"]) == (2, "exact McNemar", {"other_content": 1, "only_a": 1,
                                                                            "only_b": 1})
    md = open(str(tmp_path / "part" / "comparison.md")).read()
    assert ("Not paired between A and B: 1 shared id holding other content (another question, options or images), "
            "1 only in A, 1 only in B; the paired test (exact McNemar) and its means cover the 2 entries") in md
    exp = comp["explain"]
    assert (exp["n_pairs"], exp["refused"], exp["only_a"], exp["only_b"]) == (2, 1, 1, 1)
    assert exp["moved"] == pytest.approx(1 / 4 - 4 / 4) and exp["moved_paired"] == -1.0  # s9 right, in B only


def test_pif_followed_changed_at_the_same_pif_is_an_answer_change_not_a_verdict():
    """Two instructions, one followed in each run (another one): the PIF (0.5) did not change, so
    no sample "changed its PIF"; the other instruction followed is an answer change."""
    def recs(prediction):
        return [{"sample_id": "c0-t01", "benchmark": "MMMT-IF", "formulation": "Generation",
                 "inference_method": "generation", "question": "Q?", "answer": "R", "prediction": prediction,
                 "meta": {"chat_id": "c0", "turn": 1, "instructions": ["start_char_S", "number_odd"]}}]

    def pif_run(name, prediction):
        records = recs(prediction)
        result = score_metrics(records, "Generation", "generation")
        result.update(prediction_file=f"/x/{name}.json")
        return {"name": name, "records": records, "result": result, "info": {}}
    a, b = pif_run("a", "So I have 8 cats."), pif_run("b", "I have 7 cats.")
    pa, pb = a["result"]["per_sample"][0], b["result"]["per_sample"][0]
    assert pa["pif"] == pb["pif"] == 0.5 and pa["followed"] != pb["followed"]
    exp = explain_runs(a, b)
    assert exp["flips"] == [] and len(exp["answer_changes"]) == 1
    assert "0 samples changed their PIF" in exp["summary"]
    assert exp["summary"].endswith("; 1 more answer changed without changing a verdict")


def test_a_results_file_against_its_own_prediction_file_is_refused(tmp_path, capsys, monkeypatch):
    """The results file named relative to the working folder, its prediction file absolutely: one
    run scored one way, refused however each path was typed."""
    pred = tmp_path / "a.json"
    pred.write_text(json.dumps([_rec(0, "A"), _rec(1, "B")]))
    _write_results(tmp_path / "a.results.json", prediction_file=str(pred), formulation="SingleChoice",
                   infer_method="generation")
    monkeypatch.chdir(tmp_path)
    assert run_loader_eval.main(["--explain", "a.results.json", str(pred)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1 and "the same run scored the same way" in err


@pytest.mark.parametrize("flags", [["--formulation", "Generation"], ["--infer_method", "likelihood"]])
def test_explain_refuses_a_setting_flag_that_contradicts_the_results_file(tmp_path, capsys, flags):
    """The results file records SingleChoice/generation: a flag saying otherwise is refused in one
    line, as the scoring path refuses one contradicting the records, never silently overruled."""
    for name in ("a", "b"):
        pred = tmp_path / f"{name}.json"
        pred.write_text(json.dumps([_rec(0, "A"), _rec(1, name.upper())]))
        _write_results(tmp_path / f"{name}.results.json", prediction_file=str(pred), formulation="SingleChoice",
                       infer_method="generation")
    argv = ["--explain", str(tmp_path / "a.json"), str(tmp_path / "b.json")]
    assert run_loader_eval.main(argv + flags) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1, err
    assert f"{flags[0]} {flags[1]!r} contradicts" in err and "a.results.json, which records" in err
    assert run_loader_eval.main(argv + [flags[0], {"--formulation": "singlechoice"}.get(flags[0], "generation")]) == 0


def test_explain_and_the_comparison_pair_alike_and_never_another_question(tmp_path):
    """Same ids, options, answers and meta, other questions (another custom set): no pair, in the
    explanation (refused: share no sample) and in the comparison's paired tests alike. The same
    question with other option marks pairs in both, with the same count."""
    from reform_eval.evaluation.reporting.explain import NothingToExplain
    from reform_eval.evaluation.reporting.report import compare_runs
    a = _run("A", [_rec(i, "A") for i in range(4)], INFO_A)
    other = [dict(_rec(i, "B"), item_sha=f"o{i}", question=f"How many cats in picture {i}?") for i in range(4)]
    with pytest.raises(NothingToExplain, match="share no sample: 4 shared ids holding other content"):
        explain_runs(a, _run("B", other, INFO_A))
    comp = compare_runs([a, _run("B", other, INFO_A)], str(tmp_path / "other"), n_boot=20, plots=False)
    assert comp["paired_tests"][0]["n_pairs"] == 0 and "share no sample" in comp["explain"]["refused"]
    marks = [_rec(i, "b", marks=("a", "b"), item=f"m{i}") for i in range(4)]
    exp = explain_runs(a, _run("B", marks, INFO_A))
    comp = compare_runs([a, _run("B", marks, INFO_A)], str(tmp_path / "marks"), n_boot=20, plots=False)
    assert exp["n_pairs"] == exp["paired_by_question"] == comp["paired_tests"][0]["n_pairs"] == 4
