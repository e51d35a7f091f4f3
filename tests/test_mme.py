"""MME: builder on a generated copy of the real release, parsing rules, exact scores, the
official results format and bad input.

The official question lists ship in configs/data/mme_questions (images do not); tests lay
out a release-shaped folder with 8x8 placeholder images from them.
"""
from __future__ import annotations

import math
import os
import shutil
from collections import Counter, defaultdict

import pytest

from reform_eval.build import build_dataset
from reform_eval.build.mme import (COGNITION, OFFICIAL_COUNTS, PERCEPTION, SUBTASKS, read_question_lists,
                       write_placeholder_parquet, write_placeholder_release)
from reform_eval.metrics import evaluate
from reform_eval.metrics.mme import (mme_metric, parse_official, parse_stripped, parse_word, read_official_results,
                         write_official_results)
from reform_eval.utils.errors import ReformError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: the official question lists, shipped in configs/data (a copy of ../shared/data/mme)
QUESTIONS = os.environ.get("MME_QUESTIONS", os.path.join(ROOT, "configs", "data", "mme_questions"))
pytestmark = pytest.mark.skipif(not os.path.isdir(QUESTIONS), reason="MME question lists not available")


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    return write_placeholder_release(QUESTIONS, str(tmp_path_factory.mktemp("mme") / "release"))


@pytest.fixture(scope="module")
def gen_samples(release):
    samples, _ = build_dataset("MME", "Generation", {"root": release}, in_context_sample=False)
    return samples


def small_release(tmp_path, subtasks=("existence",)):
    return write_placeholder_release(QUESTIONS, str(tmp_path / "rel"), subtasks=list(subtasks))


def record(sample, prediction):
    rec = {k: v for k, v in sample.items() if k != "images"}
    rec["prediction"] = prediction
    return rec


# -- counts and pairing --------------------------------------------------------------------

def test_official_counts_in_question_lists():
    lists = read_question_lists(QUESTIONS)
    assert {s: len(r) for s, r in lists.items()} == OFFICIAL_COUNTS
    assert OFFICIAL_COUNTS["existence"] == 60 and OFFICIAL_COUNTS["OCR"] == 40
    assert sum(OFFICIAL_COUNTS.values()) == 2374
    assert len(PERCEPTION) == 10 and len(COGNITION) == 4


def test_builder_counts_and_pairing(gen_samples, release):
    assert len(gen_samples) == 2374
    counts = Counter(s["meta"]["subtask"] for s in gen_samples)
    assert dict(counts) == OFFICIAL_COUNTS
    assert sum(counts[s] for s in PERCEPTION) == 2114 and sum(counts[s] for s in COGNITION) == 260
    assert len({s["sample_id"] for s in gen_samples}) == 2374
    pairs = defaultdict(list)
    for s in gen_samples:
        pairs[tuple(s["meta"]["image_key"])].append(s)
    assert len(pairs) == 1187
    for key, qs in pairs.items():
        assert [q["answer"] for q in qs] == ["Yes", "No"], key
        assert qs[0]["images"] == qs[1]["images"]
    # same file name in two subtasks: two different images
    a = pairs[("existence", "000000006040.jpg")][0]["images"][0]
    b = pairs[("count", "000000006040.jpg")][0]["images"][0]
    assert a != b and os.path.isfile(a) and os.path.isfile(b)
    # nested layout for the five big subtasks
    art = pairs[("artwork", "10002.jpg")][0]["images"][0]
    assert art == os.path.join(release, "artwork", "images", "10002.jpg")
    # order and text identical to the official lists
    lists = read_question_lists(QUESTIONS)
    flat = [(s, name, q, gt) for s in SUBTASKS for (_n, name, q, gt) in lists[s]]
    assert [(x["meta"]["subtask"], x["meta"]["image"], x["question"], x["answer"]) for x in gen_samples] == flat
    assert all(x["question"].endswith(" Please answer yes or no.") and x["instruct"] == "" for x in gen_samples)
    assert all(x["candidates"] == ["Yes", "No"] and x["candidates"][x["answer_index"]] == x["answer"]
               for x in gen_samples)


def test_parquet_layout_matches_release(release, gen_samples, tmp_path):
    pq = write_placeholder_parquet(release, str(tmp_path / "mme.parquet"), subtasks=["OCR", "code_reasoning"])
    cfg = {"parquet": pq, "image_cache_dir": str(tmp_path / "cache")}
    with pytest.raises(ReformError, match="incomplete MME data: existence has 0 questions, expected 60"):
        build_dataset("MME", "Generation", cfg)
    cfg["check_counts"] = False
    samples, _ = build_dataset("MME", "Generation", cfg, in_context_sample=False)
    assert len(samples) == 80
    ref = [s for s in gen_samples if s["meta"]["subtask"] in ("OCR", "code_reasoning")]
    strip = lambda s: {k: v for k, v in s.items() if k not in ("images", "meta")}  # noqa: E731
    assert [strip(s) for s in samples] == [strip(s) for s in ref]
    assert [s["meta"]["image_key"] for s in samples] == [s["meta"]["image_key"] for s in ref]
    with open(samples[0]["images"][0], "rb") as f, open(ref[0]["images"][0], "rb") as g:
        assert f.read() == g.read()
    # subtask subset on the parquet
    sub, _ = build_dataset("MME", "Generation", {**cfg, "subtasks": ["OCR"]}, in_context_sample=False)
    assert len(sub) == 40


def test_subset_prompt_variants_and_single_choice(release):
    cfg = {"root": release, "subtasks": "cognition", "prompt": "lmms_eval"}
    gen, _ = build_dataset("MME", "Generation", cfg, in_context_sample=False)
    assert len(gen) == 260
    assert gen[0]["question"] == ("Here are the order details for my taxi ride. Should I actually pay $29.42?"
                                  "\nAnswer the question using a single word or phrase.")
    assert gen[0]["meta"]["official_question"].endswith("$29.42? Please answer yes or no.")
    sc, _ = build_dataset("MME", "SingleChoice", {"root": release, "subtasks": ["existence"]},
                          in_context_sample=False, data_duplication=2, seed=3)
    assert len(sc) == 120
    assert sc[0]["question"] == "Is there a train in this image?"
    for s in sc:
        assert sorted(s["answer_options"]) == ["No", "Yes"]
        assert s["answer_options"][s["answer"]] == s["meta"]["gt"]
        assert s["question_with_option"].endswith(f"Options: ({s['option_marks'][0]}) {s['answer_options'][0]}; "
                                                  f"({s['option_marks'][1]}) {s['answer_options'][1]}.")
    assert {tuple(s["answer_options"]) for s in sc} == {("Yes", "No"), ("No", "Yes")}  # shuffled
    lk, _ = build_dataset("MME", "SingleChoice", {"root": release, "subtasks": ["OCR"]},
                          inference_method="likelihood", in_context_sample=False)
    assert all(s["candidates"] == s["answer_options"] for s in lk)


# -- parsing ---------------------------------------------------------------------------------

@pytest.mark.parametrize("response, official, stripped, word", [
    ("yes", "yes", "yes", "yes"),
    ("No", "no", "no", "no"),
    ("YES", "yes", "yes", "yes"),
    ("  yes", "other", "yes", "yes"),       # leading spaces push "yes" past the 4-char prefix
    (" no", "no", "no", "no"),
    ("No.", "no", "no", "no"),
    ("Yes, there is a train.", "yes", "yes", "yes"),
    ("", "other", "other", "other"),
    ("y", "other", "yes", "other"),
    ("N.", "other", "no", "other"),
    ("Yes\nNo", "yes", "yes", "other"),
    ("\nyes", "yes", "yes", "yes"),
    ("No,\nthere is no train.", "no", "no", "no"),
    ("not sure", "no", "no", "other"),
    ("The answer is yes", "other", "other", "yes"),
    ("nope", "no", "no", "other"),
    ("yesterday", "yes", "yes", "other"),
    ("I think no.", "other", "other", "no"),
    ("...yes", "other", "yes", "yes"),
])
def test_parse_rules(response, official, stripped, word):
    assert parse_official(response) == official
    assert parse_stripped(response) == stripped
    assert parse_word(response) == word


# -- exact scores -----------------------------------------------------------------------------

def _fixture_records():
    """existence: 3 images; count: 2 images. Hand-computed expectations in the test."""
    rows = [
        ("existence", "a.jpg", "Yes", "Yes"), ("existence", "a.jpg", "No", "no."),          # both right
        ("existence", "b.jpg", "Yes", "yes, it is"), ("existence", "b.jpg", "No", "Yes"),  # one right (FP)
        ("existence", "c.jpg", "Yes", "maybe"), ("existence", "c.jpg", "No", "No"),        # other + TN
        ("count", "a.jpg", "Yes", "No"), ("count", "a.jpg", "No", "no"),                    # FN + TN
        ("count", "d.jpg", "Yes", "YES"), ("count", "d.jpg", "No", "No"),                   # both right
        ("code_reasoning", "0001.png", "Yes", "The answer is yes"),                         # other
        ("code_reasoning", "0001.png", "No", "not sure"),                                   # no: right
    ]
    recs, k = [], defaultdict(int)
    for sub, img, gt, pred in rows:
        idx = k[(sub, img)]
        k[(sub, img)] += 1
        recs.append({"sample_id": f"{sub}/{img}/{idx}", "dup_index": 0, "benchmark": "MME",
                     "formulation": "Generation", "inference_method": "generation", "answer": gt,
                     "prediction": pred, "meta": {"subtask": sub, "image": img}})
    return recs


def test_exact_scores_hand_computed():
    res = mme_metric(_fixture_records())
    m = res["metrics"]
    ex, co, cr = m["subtasks"]["existence"], m["subtasks"]["count"], m["subtasks"]["code_reasoning"]
    # existence: right = a0 a1 b0 c1 = 4/6; acc+ = 1/3 (a); score = 66.67 + 33.33 = 100
    assert ex["acc"] == pytest.approx(4 / 6) and ex["acc_plus"] == pytest.approx(1 / 3)
    assert ex["score"] == pytest.approx(100.0)
    assert (ex["TP"], ex["FN"], ex["TN"], ex["FP"], ex["other_num"]) == (2, 0, 2, 1, 1)
    assert ex["precision"] == pytest.approx(2 / 3) and ex["recall"] == 1.0
    # count: right = a1 d0 d1 = 3/4; acc+ = 1/2; score = 75 + 50 = 125
    assert (co["acc"], co["acc_plus"], co["score"]) == (0.75, 0.5, 125.0)
    assert (co["TP"], co["FN"], co["TN"], co["FP"], co["other_num"]) == (1, 1, 2, 0, 0)
    assert co["precision"] == 1.0 and co["recall"] == 0.5
    # code_reasoning: 1/2 right, acc+ 0 -> 50; precision undefined -> 0
    assert (cr["acc"], cr["acc_plus"], cr["score"], cr["other_num"]) == (0.5, 0.0, 50.0, 1)
    assert cr["precision"] == 0.0 and cr["recall"] == 0.0
    assert m["perception_score"] == pytest.approx(225.0) and m["cognition_score"] == 50.0
    assert m["parse_rule"] == "official" and m["other_num"] == 2
    assert [p["parsed"] for p in res["per_sample"]] == ["yes", "no", "yes", "yes", "other", "no", "no", "no",
                                                        "yes", "no", "other", "no"]
    assert "| existence | perception | 6 | 66.67 | 33.33 | 100.00 | 2 | 0 | 2 | 1 |" in res["tables"]["MME subtasks"]
    # the word rule changes code_reasoning: "The answer is yes" -> yes (FP... no: gt Yes -> TP), "not sure" -> other
    w = mme_metric(_fixture_records(), mme_parse="word")["metrics"]
    assert w["parse_rule"] == "word"
    assert (w["subtasks"]["code_reasoning"]["acc"], w["subtasks"]["code_reasoning"]["TP"]) == (0.5, 1)
    # dispatch through the registry picks this metric for MME
    assert evaluate(_fixture_records(), "Generation", "generation")["metric"] == "mme"


def test_full_set_reference_scores(gen_samples):
    perfect = mme_metric([record(s, s["answer"]) for s in gen_samples])["metrics"]
    assert perfect["perception_score"] == pytest.approx(2000.0) and perfect["cognition_score"] == pytest.approx(800.0)
    assert all(m["score"] == 200.0 and m["num_questions"] == OFFICIAL_COUNTS[s] for s, m in perfect["subtasks"].items())
    always_yes = mme_metric([record(s, "Yes") for s in gen_samples])["metrics"]
    assert always_yes["perception_score"] == pytest.approx(500.0)   # acc 0.5, acc+ 0 -> 50 each
    assert always_yes["cognition_score"] == pytest.approx(200.0)
    assert always_yes["subtasks"]["posters"]["FP"] == 147 and always_yes["subtasks"]["posters"]["TP"] == 147
    assert always_yes["subtasks"]["posters"]["precision"] == 0.5 and always_yes["subtasks"]["posters"]["recall"] == 1.0
    # only the first question of each pair right: swap gives acc 0.5 acc+ 0 as well
    assert mme_metric([record(s, "no") for s in gen_samples])["metrics"]["total_score"] == pytest.approx(700.0)


def test_single_choice_likelihood_and_stability(release):
    sc, _ = build_dataset("MME", "SingleChoice", {"root": release, "subtasks": ["color"]},
                          in_context_sample=False, data_duplication=2, seed=1)
    # generation: always answer option (A) -> right when A is the answer
    recs = [record(s, "(A)") for s in sc]
    res = mme_metric(recs, formulation="SingleChoice", infer_method="generation", eval_stability=True)
    m = res["metrics"]["subtasks"]["color"]
    want = sum(s["answer"] == 0 for s in sc) / len(sc)
    assert m["acc"] == pytest.approx(want) and m["num_questions"] == 120
    # "(A)" names a different answer in the two duplicates exactly when their orders differ
    orders = defaultdict(set)
    for s in sc:
        orders[s["sample_id"]].add(tuple(s["answer_options"]))
    flips = sum(len(o) == 2 for o in orders.values())
    assert 0 < flips < 60
    assert res["metrics"]["instability"] == pytest.approx(flips * math.log(2) / 60)
    assert res["metrics"]["parse_rule"] == "option_marks"
    # likelihood: scores favour "Yes" -> acc 0.5, acc+ 0, every answer parsed
    lk, _ = build_dataset("MME", "Generation", {"root": release, "subtasks": ["color"]},
                          inference_method="likelihood", in_context_sample=False)
    recs = [dict(record(s, 0), candidate_logprobs=[-1.0, -2.0], candidate_num_tokens=[1, 1]) for s in lk]
    res = mme_metric(recs, infer_method="likelihood")
    assert res["metrics"]["parse_rule"] == "likelihood_sum"
    m = res["metrics"]["subtasks"]["color"]
    assert (m["acc"], m["acc_plus"], m["other_num"], m["TP"], m["FP"]) == (0.5, 0.0, 0, 30, 30)


# -- official results format ---------------------------------------------------------------------

def _official_calculation(results_dir):
    """The official eval tool's procedure, reproduced for cross-checking: readlines (newline kept
    in the response), chunks of two lines, lower-case, the 4-character prefix rule."""
    scores = {}
    for sub in SUBTASKS:
        lines = open(os.path.join(results_dir, sub + ".txt")).readlines()
        chunks = [lines[i:i + 2] for i in range(0, len(lines), 2)]
        right, plus = 0, 0
        for chunk in chunks:
            assert len(chunk) == 2
            n = 0
            for item in chunk:
                _img, _q, gt, pred = item.split("\t")
                gt, pred = gt.lower(), pred.lower()
                label = pred if pred in ("yes", "no") else (
                    "yes" if "yes" in pred[:4] else "no" if "no" in pred[:4] else "other")
                n += gt == label
            right += n
            plus += n == 2
        scores[sub] = right / len(lines) * 100 + plus / len(chunks) * 100
    return scores


RESPONSES = ["Yes", "No", "no.", "  yes", "Yes\nbecause\tthe image shows it", "", "not sure",
             "The answer is yes", "y", "NO, it is not", "yes\r\nno", "maybe"]


def test_round_trip_official_format(gen_samples, tmp_path):
    recs = [record(s, RESPONSES[i % len(RESPONSES)]) for i, s in enumerate(gen_samples)]
    out = tmp_path / "results"
    written = write_official_results(recs, str(out))
    assert written == OFFICIAL_COUNTS
    # the first three columns are exactly the official question lists
    for sub in SUBTASKS:
        ours = [ln.rstrip("\n").split("\t")[:3] for ln in open(out / f"{sub}.txt", encoding="utf-8")]
        ref = [ln.rstrip("\n").split("\t") for ln in open(os.path.join(QUESTIONS, f"{sub}.txt"), encoding="utf-8")]
        assert ours == ref, sub
        assert all(len(ln.split("\t")) == 4 for ln in open(out / f"{sub}.txt", encoding="utf-8"))
    back = read_official_results(str(out))
    assert len(back) == 2374
    official = _official_calculation(str(out))
    for rule in ("official", "stripped", "word"):
        direct = mme_metric(recs, mme_parse=rule)["metrics"]
        again = mme_metric(back, mme_parse=rule)["metrics"]
        for sub in SUBTASKS:
            for key in ("acc", "acc_plus", "score", "TP", "FN", "TN", "FP", "other_num"):
                assert direct["subtasks"][sub][key] == pytest.approx(again["subtasks"][sub][key]), (rule, sub, key)
            if rule == "official":
                assert direct["subtasks"][sub]["score"] == pytest.approx(official[sub]), sub
        assert direct["perception_score"] == pytest.approx(again["perception_score"])
        assert direct["cognition_score"] == pytest.approx(again["cognition_score"])


def test_round_trip_single_choice(release, tmp_path):
    sc, _ = build_dataset("MME", "SingleChoice", {"root": release, "subtasks": ["OCR"]}, in_context_sample=False)
    recs = [record(s, ["(A)", "(B)", "I cannot tell"][i % 3]) for i, s in enumerate(sc)]
    direct = mme_metric(recs, formulation="SingleChoice")["metrics"]["subtasks"]["OCR"]
    write_official_results(recs, str(tmp_path / "r"))
    again = mme_metric(read_official_results(str(tmp_path / "r")))["metrics"]["subtasks"]["OCR"]
    assert (direct["acc"], direct["acc_plus"], direct["other_num"]) == (again["acc"], again["acc_plus"],
                                                                        again["other_num"])
    assert direct["other_num"] == 13


# -- bad input ----------------------------------------------------------------------------------

def test_missing_image_and_bad_question_files(tmp_path):
    rel = small_release(tmp_path)
    folder = os.path.join(rel, "existence")
    cfg = {"root": rel, "subtasks": ["existence"]}
    os.remove(os.path.join(folder, "000000006040.jpg"))
    with pytest.raises(ReformError, match=r"existence/000000006040\.txt.*no image"):
        build_dataset("MME", "Generation", cfg)
    rel = small_release(tmp_path / "b")
    txt = os.path.join(rel, "existence", "000000006040.txt")
    with open(txt, "a", encoding="utf-8") as f:
        f.write("Is there a cat? Please answer yes or no.\tNo\n")
    with pytest.raises(ReformError, match=r"000000006040\.txt: record line 3: .*3 question"):
        build_dataset("MME", "Generation", {"root": rel, "subtasks": ["existence"]})
    with open(txt, "w", encoding="utf-8") as f:
        f.write("Is there a train? Please answer yes or no.\tYes\nIs there a bed? Please answer yes or no.\tMaybe\n")
    with pytest.raises(ReformError, match=r"000000006040\.txt: record line 2: field 'answer': .*'Maybe'"):
        build_dataset("MME", "Generation", {"root": rel, "subtasks": ["existence"]})


def test_count_check_and_corrupt_images(tmp_path):
    rel = small_release(tmp_path, subtasks=SUBTASKS)
    os.remove(os.path.join(rel, "OCR", "0001.jpg"))
    os.remove(os.path.join(rel, "OCR", "0001.txt"))
    with pytest.raises(ReformError, match="OCR has 38 questions, expected 40"):
        build_dataset("MME", "Generation", {"root": rel})
    samples, _ = build_dataset("MME", "Generation", {"root": rel, "check_counts": False})
    assert len(samples) == 2372
    bad = os.path.join(rel, "scene", "images", "Places365_val_00000001.jpg")
    with open(bad, "wb") as f:
        f.write(b"not an image at all")
    cfg = {"root": rel, "subtasks": ["scene"]}
    with pytest.raises(ReformError, match=r"Places365_val_00000001\.jpg: image cannot be decoded"):
        build_dataset("MME", "Generation", cfg)
    samples, builder = build_dataset("MME", "Generation", {**cfg, "skip_corrupt": True, "check_counts": True})
    assert len(samples) == 398
    assert builder.build_info == {"skipped_corrupt_images": 1, "skipped_corrupt": ["scene/Places365_val_00000001.jpg"]}
    assert any("skipped corrupt image scene/Places365_val_00000001.jpg" in ln for ln in builder.build_log)


def test_bad_results_files(tmp_path):
    d = tmp_path / "res"
    d.mkdir()
    (d / "existence.txt").write_text("a.jpg\tIs it? Please answer yes or no.\tYes\tyes\n"
                                     "a.jpg\tIs it not? Please answer yes or no.\tNo\n", encoding="utf-8")
    with pytest.raises(ReformError, match=r"existence\.txt: record line 2: expected 4 tab-separated fields"):
        read_official_results(str(d))
    (d / "existence.txt").write_text("a.jpg\tq1\tYes\tyes\na.jpg\tq2\tPerhaps\tno\n", encoding="utf-8")
    with pytest.raises(ReformError, match=r"existence\.txt: record line 2: field 'GT'"):
        read_official_results(str(d))
    (d / "existence.txt").write_text("a.jpg\tq1\tYes\tyes\na.jpg\tq2\tNo\tno\nb.jpg\tq3\tYes\tyes\n\n",
                                     encoding="utf-8")
    with pytest.raises(ReformError, match=r"existence\.txt: record line 3: image b\.jpg has 1 line"):
        read_official_results(str(d))
    shutil.rmtree(d)
    d.mkdir()
    with pytest.raises(ReformError, match="no <subtask>.txt results files"):
        read_official_results(str(d))
    # a partial results folder scores what is there and says what is missing
    (d / "OCR.txt").write_text("a.jpg\tq1\tYes\tyes\na.jpg\tq2\tNo\tno\n", encoding="utf-8")
    m = mme_metric(read_official_results(str(d)))["metrics"]
    assert m["subtasks"]["OCR"]["score"] == 200.0 and len(m["subtasks_missing"]) == 13
    with pytest.raises(ReformError, match=r"preds\.json: record 0: field 'answer'"):
        mme_metric([{"sample_id": "OCR/a.jpg/0", "answer": "maybe", "prediction": "yes",
                     "meta": {"subtask": "OCR", "image": "a.jpg"}}], file="preds.json")
    with pytest.raises(ReformError, match="unknown MME parse rule 'fuzzy'"):
        mme_metric(_fixture_records(), mme_parse="fuzzy")


# -- parquet image cache (issue 9 item 4) ------------------------------------------------------

def _png_bytes(colour):
    import io

    from PIL import Image
    buf = io.BytesIO()
    Image.new("RGB", (8, 8), colour).save(buf, format="BMP")  # fixed size for every colour
    return buf.getvalue()


def _parquet(path, images):
    """images: {question_id: png bytes}; two questions (Yes, No) per image."""
    import datasets
    cols = {"question_id": [], "image": [], "question": [], "answer": [], "category": []}
    for qid, data in images.items():
        for q, gt in (("Is it red? Please answer yes or no.", "Yes"), ("Is it blue? Please answer yes or no.", "No")):
            cols["question_id"].append(qid)
            cols["image"].append({"bytes": data, "path": qid.split("/", 1)[1]})
            cols["question"].append(q)
            cols["answer"].append(gt)
            cols["category"].append("count")
    feats = datasets.Features({"question_id": datasets.Value("string"), "image": datasets.Image(),
                               "question": datasets.Value("string"), "answer": datasets.Value("string"),
                               "category": datasets.Value("string")})
    datasets.Dataset.from_dict(cols, features=feats).to_parquet(str(path))
    return str(path)


def test_parquet_cache_unique_per_question_id_and_file(tmp_path):
    red, blue, green = _png_bytes((255, 0, 0)), _png_bytes((0, 0, 255)), _png_bytes((0, 255, 0))
    assert len(red) == len(blue) == len(green)  # same size: a size check cannot tell them apart
    cache = str(tmp_path / "cache")
    first = _parquet(tmp_path / "one.parquet", {"count/a/x.png": red, "count/b/x.png": blue})
    cfg = {"parquet": first, "image_cache_dir": cache, "check_counts": False, "subtasks": ["count"]}
    samples, _ = build_dataset("MME", "Generation", cfg, in_context_sample=False)
    by_key = {s["meta"]["image"]: s["images"][0] for s in samples}
    assert set(by_key) == {"a/x.png", "b/x.png"} and by_key["a/x.png"] != by_key["b/x.png"]
    assert open(by_key["a/x.png"], "rb").read() == red and open(by_key["b/x.png"], "rb").read() == blue
    # another parquet file, same question id, other image, same cache folder: its own file
    second = _parquet(tmp_path / "two.parquet", {"count/a/x.png": green})
    other, _ = build_dataset("MME", "Generation", dict(cfg, parquet=second), in_context_sample=False)
    path = other[0]["images"][0]
    assert open(path, "rb").read() == green and path != by_key["a/x.png"]
    assert open(by_key["a/x.png"], "rb").read() == red
    # a rebuild of the first reuses its files unchanged
    again, _ = build_dataset("MME", "Generation", cfg, in_context_sample=False)
    assert [s["images"] for s in again] == [s["images"] for s in samples]


# -- official results files (issue 11 §5) --------------------------------------------------------

def _results_dir(tmp_path, lines, name="existence.txt", raw=None):
    d = tmp_path / "results"
    d.mkdir(exist_ok=True)
    p = d / name
    if raw is not None:
        p.write_bytes(raw)
    else:
        p.write_text("".join(ln + "\n" for ln in lines), encoding="utf-8")
    return str(d), str(p)


def test_results_file_not_utf8_is_one_line(tmp_path, capsys):
    from reform_eval import run_loader_eval
    d, p = _results_dir(tmp_path, [], raw="a.jpg\tIs it? Please answer yes or no.\tYes\tOui, c'est \u00e7a\n"
                        .encode("latin-1"))
    with pytest.raises(ReformError, match=r"existence\.txt: .*not UTF-8") as e:
        read_official_results(d)
    assert "\n" not in str(e.value) and p in str(e.value)
    assert run_loader_eval.main(["--dataset_name", "MME", "--prediction_file", d]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not UTF-8" in err[0] and p in err[0]


def test_results_image_names_stripped(tmp_path):
    q = "Is there a dog? Please answer yes or no."
    d, _ = _results_dir(tmp_path, [f"a.jpg \t{q}\tYes\tyes", f" a.jpg\t{q}\tNo\tno",
                                   f"b.jpg\t{q}\tYes\tno", f"b.jpg\u00a0\t{q}\tNo\tno"])
    recs = read_official_results(d)
    assert [r["meta"]["image"] for r in recs] == ["a.jpg", "a.jpg", "b.jpg", "b.jpg"]
    m = mme_metric(recs)["metrics"]["subtasks"]["existence"]
    assert (m["acc"], m["acc_plus"]) == (0.75, 0.5)


def test_results_lines_of_an_image_not_adjacent_warn(tmp_path, caplog):
    q = "Is there a dog? Please answer yes or no."
    lines = [f"a.jpg\t{q}\tYes\tyes", f"b.jpg\t{q}\tYes\tyes", f"a.jpg\t{q}\tNo\tno", f"b.jpg\t{q}\tNo\tyes"]
    d, p = _results_dir(tmp_path, lines)
    with caplog.at_level("WARNING", logger="reform_eval.metrics.mme"):
        recs = read_official_results(d)
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warned) == 1 and p in warned[0] and "not adjacent" in warned[0]
    assert "2 image(s)" in warned[0] and "a.jpg (lines 1, 3)" in warned[0]
    # we pair by image name: a = both right, b = one right
    m = mme_metric(recs)["metrics"]["subtasks"]["existence"]
    assert (m["acc"], m["acc_plus"]) == (0.75, 0.5)
    caplog.clear()
    adjacent = [lines[0], lines[2], lines[1], lines[3]]
    (tmp_path / "ok").mkdir()
    d2, _ = _results_dir(tmp_path / "ok", adjacent)
    with caplog.at_level("WARNING", logger="reform_eval.metrics.mme"):
        read_official_results(d2)
    assert not [r for r in caplog.records if r.levelname == "WARNING"]
