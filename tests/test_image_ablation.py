"""``--image_ablation`` (build.ablation) and the image-dependence table (evaluation.reporting.image_dependence).

Exact checks on built samples: the shuffle never gives a sample its own image (and is a
derangement of MME's images, both questions of an image moving together), blank and noise keep
each image's size and stay lazy for file images, seeds reproduce, ``none`` removes the
placeholders, the run identity changes with the flag, a model that needs an image gets the
blank. Then runs: an ablated item pairs with its intact item and nothing else; on the
``random`` baseline the difference is 0 with an interval covering 0; a blind MME run reports
acc+; and the known-skill model (``tiny-trained``) falls from far above chance to chance under
every ablation (slow).
"""
from __future__ import annotations

import json
import logging
import math
import os

import pytest
from PIL import Image

from reform_eval.build import build_dataset, load_reform_dataset
from reform_eval.build.ablation import IMAGE_ABLATIONS, strip_placeholders
from reform_eval.build.mme_synthetic import write_yesno_release
from reform_eval.evaluation import (DatasetConfig, GenerationConfig, ModelConfig, OutputConfig, RunConfig, ScoringConfig,
                        evaluate, score)
from reform_eval.evaluation.plan import identity
from reform_eval.models import needs_image
from reform_eval.utils.fingerprint import image_token, samples_fingerprint
from reform_eval.utils.images import SyntheticImage
from reform_eval.utils.schema import IMAGE_TOKEN
from reform_eval.utils.preprocessors import ConvProcessor

SIZES = [(32, 20), (50, 40), (20, 60), (41, 17), (64, 64), (33, 31)]


def write_items(directory, shared=True, placeholder=True) -> str:
    """Six items, each image of another size; items q4 and q5 share one file (when ``shared``);
    q1 places its image with a placeholder in the question (when ``placeholder``)."""
    os.makedirs(directory, exist_ok=True)
    lines = []
    for i, size in enumerate(SIZES):
        name = f"img{4 if shared and i == 5 else i}.png"
        if not os.path.exists(os.path.join(directory, name)):
            Image.new("RGB", size, (40 * i, 200 - 30 * i, 90)).save(os.path.join(directory, name))
        q = f"Look: {IMAGE_TOKEN}\nWhich colour?" if placeholder and i == 1 else "Which colour fills the image?"
        lines.append(json.dumps({"sample_id": f"q{i}", "images": [name], "question": q,
                                 "answer_options": ["red", "green", "blue"], "answer": i % 3}))
    with open(os.path.join(directory, "items.jsonl"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(directory, "custom.yaml"), "w") as f:
        f.write("data_file: items.jsonl\n")
    return os.path.join(directory, "custom.yaml")


def build(cfg, ablation, seed=0, dataset="custom", formulation="SingleChoice", **kw):
    return build_dataset(dataset, formulation, cfg, seed=seed, image_ablation=ablation, **kw)


def tokens(sample, cache=None):
    return [image_token(im, {} if cache is None else cache) for im in sample["images"]]


# -- the transformation ----------------------------------------------------------------------------
def test_shuffle_never_gives_a_sample_its_own_image(tmp_path):
    cfg = write_items(str(tmp_path / "d"))
    intact, _ = build(cfg, None)
    for seed in range(5):
        shuffled, builder = build(cfg, "shuffle", seed=seed)
        for a, b in zip(intact, shuffled):
            assert b["images"] and set(tokens(b)).isdisjoint(tokens(a)), (seed, a["sample_id"], b["images"])
        # q4 and q5 share img4.png: neither may get it back from the other
        assert all(os.path.basename(s["images"][0]) != "img4.png" for s in shuffled if s["sample_id"] in ("q4", "q5"))
        assert builder.build_info["image_ablation"] == {"requested": "shuffle", "applied": "shuffle", "samples": 6,
                                                        "images_replaced": 6}


def test_mme_shuffle_is_a_derangement_of_the_images(tmp_path):
    """MME shares an image between its two questions: the shuffle moves whole images (both
    questions get the same other image), and every image of the build is used exactly once."""
    root = write_yesno_release(str(tmp_path / "mme"), n_images=6, seed=1)
    intact, _ = build("mme_synthetic", None, dataset="MME", formulation="Generation", root=root)
    shuffled, _ = build("mme_synthetic", "shuffle", dataset="MME", formulation="Generation", root=root)
    donor = {}
    for a, b in zip(intact, shuffled):
        (own,), (got,) = a["images"], b["images"]
        assert got != own
        assert donor.setdefault(own, got) == got  # both questions of one image: one donor
    assert len(donor) == 12 and sorted(donor.values()) == sorted(donor)  # a permutation without fixed points


def test_iwisdm_shuffle_keeps_no_frame_of_the_trial(tmp_path):
    """Multi-frame trials share their delay frames (same pixels): a shuffled trial holds none of its
    own frames, and no image token of the intact trial."""
    opts = {"n_trials": 8}
    intact, _ = build("iwisdm_medium", None, dataset="iWISDM", extra_options=opts)
    shuffled, _ = build("iwisdm_medium", "shuffle", dataset="iWISDM", extra_options=opts)
    cache = {}
    for a, b in zip(intact, shuffled):
        assert len(b["images"]) == len(a["images"]) > 1
        assert set(tokens(b, cache)).isdisjoint(tokens(a, cache)), a["sample_id"]


@pytest.mark.parametrize("kind", ["blank", "noise"])
def test_blank_and_noise_keep_the_size_and_stay_lazy(tmp_path, kind):
    cfg = write_items(str(tmp_path / "d"), shared=False)
    samples, _ = build(cfg, kind)
    for s, size in zip(samples, SIZES):
        (im,) = s["images"]
        assert isinstance(im, SyntheticImage) and im.size == size and im.kind == kind  # no pixels held
    ds = load_reform_dataset("custom", "SingleChoice", cfg, image_ablation=kind)
    for i, size in enumerate(SIZES):
        pil = ds[i]["images"][0]
        assert isinstance(pil, Image.Image) and pil.size == size and pil.mode == "RGB"
        extrema = pil.getextrema()
        if kind == "blank":
            assert extrema == ((0, 0), (0, 0), (0, 0))
        else:
            assert all(hi - lo > 200 for lo, hi in extrema)
        # the fingerprint of the stand-in is the fingerprint of its pixels
        assert image_token(samples[i]["images"][0], {}) == image_token(pil, {})
    lazy = load_reform_dataset("custom", "SingleChoice", cfg, image_ablation=kind, lazy_images=True)
    assert isinstance(lazy[0]["images"][0], Image.Image)  # a stand-in is no file a caller could open


def test_seeds_reproduce(tmp_path):
    cfg = write_items(str(tmp_path / "d"), shared=False)
    for kind in ("noise", "shuffle"):
        one, two, other = build(cfg, kind, seed=3)[0], build(cfg, kind, seed=3)[0], build(cfg, kind, seed=4)[0]
        assert samples_fingerprint(one)[0] == samples_fingerprint(two)[0]
        imgs = [tuple(tokens(s)) for s in one]
        assert imgs == [tuple(tokens(s)) for s in two]
        assert imgs != [tuple(tokens(s)) for s in other], kind
    # noise depends on the group and the seed only: the same item in a smaller build gets the same noise
    full = build("iwisdm_low", "noise", dataset="iWISDM", extra_options={"n_trials": 6})[0]
    part = build("iwisdm_low", "noise", dataset="iWISDM", extra_options={"n_trials": 6}, subsample=2)[0]
    by_id = {s["sample_id"]: tokens(s) for s in full}
    assert all(tokens(s) == by_id[s["sample_id"]] for s in part)


def test_none_removes_the_images_and_their_placeholders(tmp_path):
    cfg = write_items(str(tmp_path / "d"))
    samples, builder = build(cfg, "none")
    assert all(s["images"] == [] for s in samples)
    q1 = next(s for s in samples if s["sample_id"] == "q1")
    assert q1["question"] == "Look: Which colour?" and IMAGE_TOKEN not in q1["question_with_option"]
    trials, _ = build("iwisdm_medium", "none", dataset="iWISDM", extra_options={"n_trials": 3, "n_examples": 1},
                      in_context_sample=True)
    pre = ConvProcessor()
    for s in trials:
        assert s["images"] == [] and IMAGE_TOKEN not in pre(s)
        assert all(IMAGE_TOKEN not in t["value"] for t in s["history"])
    assert strip_placeholders(f"frames ...{IMAGE_TOKEN} {IMAGE_TOKEN}\n\nQ") == "frames ...\nQ"
    assert builder.build_info["image_ablation"]["applied"] == "none"


def test_every_ablated_sample_names_its_intact_item(tmp_path):
    cfg = write_items(str(tmp_path / "d"))
    intact, _ = build(cfg, None)
    _, _, items = samples_fingerprint(intact)
    for mode in IMAGE_ABLATIONS:
        ablated, _ = build(cfg, mode)
        assert [s["image_ablation"]["intact_item_sha"] for s in ablated] == [d[:16] for d in items]
        assert all(s["image_ablation"]["mode"] == mode for s in ablated)
        assert samples_fingerprint(ablated)[2] != items  # the ablated items themselves are other items


def test_run_identity_changes_with_the_flag():
    def ident(mode):
        cfg = RunConfig(model=ModelConfig("random"),
                        dataset=DatasetConfig("iWISDM", config="iwisdm_low", image_ablation=mode)).validated()
        return identity(cfg, {"preset": "low"}, "fingerprint")
    ids = {mode: ident(mode) for mode in (None,) + IMAGE_ABLATIONS}
    assert len({h for h, _ in ids.values()}) == 5
    assert "image_ablation" not in ids[None][1]  # runs without the flag keep their identities
    assert ids["shuffle"][1]["image_ablation"] == "shuffle"


def test_flag_parses_round_trips_and_refuses_other_values(capsys):
    argv = ["--model", "random", "--dataset_name", "iWISDM", "--image_ablation", "noise"]
    cfg = RunConfig.from_argv(argv)
    assert cfg.dataset.image_ablation == "noise" and cfg.flags()["image_ablation"] == "noise"
    assert "--image_ablation noise" in cfg.command_line()
    assert RunConfig.from_argv(cfg.command_line().split()[1:]).dataset.image_ablation == "noise"
    with pytest.raises(SystemExit) as e:
        RunConfig.from_argv(argv[:-1] + ["gray"])
    assert e.value.code == 2 and "invalid choice: 'gray'" in capsys.readouterr().err
    from reform_eval.utils.errors import ReformError
    with pytest.raises(ReformError, match="image_ablation"):
        RunConfig(model=ModelConfig("random"), dataset=DatasetConfig("iWISDM", image_ablation="gray")).validated()


def test_a_family_that_needs_an_image_gets_the_blank(tmp_path, caplog):
    """Tried on each tiny family: BLIP-2, InstructBLIP and PaliGemma cannot run a prompt without
    an image (tests/test_zoo.py-style runs); every other family can."""
    assert [f for f in ("llava", "llava_next", "llava_onevision", "qwen2_vl", "idefics3", "internvl", "blip2",
                        "instructblip", "paligemma", "mllama", "openai_api", "random") if needs_image(f)] == \
        ["blip2", "instructblip", "paligemma"]
    cfg = write_items(str(tmp_path / "d"))
    with caplog.at_level(logging.WARNING, logger="reform_eval.build.ablation"):
        samples, builder = build(cfg, "none", image_required=True)
    assert [r.getMessage() for r in caplog.records if "cannot run without an image" in r.getMessage()]
    assert all(isinstance(s["images"][0], SyntheticImage) and s["images"][0].kind == "blank" for s in samples)
    assert samples[0]["image_ablation"]["mode"] == "blank" and samples[0]["image_ablation"]["requested"] == "none"
    assert builder.build_info["image_ablation"]["applied"] == "blank"


# -- runs and the comparison ----------------------------------------------------------------------
def _run(out, model="random", name=None, ablation=None, dataset="iWISDM", config="iwisdm_low", options=None,
         formulation="SingleChoice", method="generation", do_eval=True):
    cfg = RunConfig(model=ModelConfig(model, name),
                    dataset=DatasetConfig(dataset, formulation=formulation, config=config,
                                          options=options if options is not None else {"n_trials": 20},
                                          image_ablation=ablation),
                    generation=GenerationConfig(infer_method=method, batch_size=8, max_new_tokens=4),
                    scoring=ScoringConfig(do_eval=do_eval), output=OutputConfig(output_dir=str(out), use_cache=False))
    return evaluate(cfg)


def test_random_baseline_shows_no_difference_and_pairs_only_its_own_items(tmp_path):
    out = tmp_path / "out"
    intact = _run(out, do_eval=False)  # (scored once, together, below)
    _run(out, ablation="shuffle", do_eval=False)
    _run(out, options={"n_trials": 20, "seed": 9}, do_eval=False)  # other trials under the same ids: never paired
    comp = score([str(out)], output_dir=str(tmp_path / "report"), quiet=True).comparison
    (dep,) = comp["image_dependence"]
    assert os.path.basename(intact.prediction_file)[:-len(".json")] in dep["with_images"]  # the seed-0 trials
    assert dep["ablated"].startswith("random (images: shuffle)")
    assert dep["n_pairs"] == 20 and dep["n_unpaired"] == 0
    (row,) = dep["rows"]  # one complexity: no group rows beside "all"
    headline = {m["name"]: m["headline"]["accuracy"]["value"] for m in comp["models"]}
    assert row["with_images"]["value"] == row["ablated"]["value"] == headline[dep["with_images"]]
    diff = row["difference"]
    assert diff["value"] == 0.0 and diff["low"] < 0.0 < diff["high"]
    assert diff["high"] == pytest.approx(1 - 0.025 ** (1 / 20))  # no item changed: the exact bound
    assert all(p["right_without_image"] == p["right_with_image"] for p in dep["per_sample"])
    md = open(os.path.join(str(tmp_path / "report"), "comparison.md")).read()
    assert "## Image dependence" in md and "another sample's images" in md
    assert "Image dependence" in open(os.path.join(str(tmp_path / "report"), "report.html")).read()


def test_blind_mme_run_reports_acc_plus(tmp_path):
    root = write_yesno_release(str(tmp_path / "mme"), n_images=6, seed=2)
    res = _run(tmp_path / "out", model="llava", name="tiny-trained", ablation="none", dataset="MME",
               config="mme_synthetic", options={"root": root}, formulation="Generation")
    m = res.metrics
    assert m["num_records"] == 24 and set(m["subtasks"]) == {"existence", "color"}
    for sub in m["subtasks"].values():
        assert 0.0 <= sub["acc_plus"] <= sub["acc"] <= 1.0
        assert sub["score"] == pytest.approx(100 * (sub["acc"] + sub["acc_plus"]))
    assert m["perception_score"] == pytest.approx(sum(s["score"] for s in m["subtasks"].values()))
    summary = json.load(open(res.results_files["json"]))
    assert summary["build_info"]["image_ablation"]["applied"] == "none"
    assert summary["config"]["image_ablation"] == "none"
    records = json.load(open(res.prediction_file))
    assert all(r["image_ids"] == [] and IMAGE_TOKEN not in r["prompt"] for r in records)


#: identification by likelihood: per preset, the known-skill model names the category (chance 1/8)
#: and the location (chance 1/4) of the one object
TRIALS = 24


@pytest.mark.slow
def test_known_skill_model_falls_to_chance_under_every_ablation(tmp_path):
    out = tmp_path / "out"
    opts = {"preset": ["identify_category", "identify_location"], "n_trials": TRIALS}
    for mode in (None,) + IMAGE_ABLATIONS:
        _run(out, model="llava", name="tiny-trained", ablation=mode, config="iwisdm_identify_category",
             options=opts, method="likelihood", do_eval=False)
    comp = score([str(out)], output_dir=str(tmp_path / "report"), quiet=True).comparison
    deps = comp["image_dependence"]
    assert [d["mode"] for d in deps] == list(IMAGE_ABLATIONS)
    for d in deps:
        assert d["n_pairs"] == 2 * TRIALS
        rows = {r["group"]: r for r in d["rows"]}
        assert set(rows) == {"all", "identify_category", "identify_location"}
        assert rows["all"]["difference"]["low"] > 0.3, d["mode"]  # the image is what the answers rest on
        for g in ("identify_category", "identify_location"):
            r = rows[g]
            chance, n = r["chance"], r["n"]
            assert r["with_images"]["value"] >= 0.8, (d["mode"], g)  # the intact control, far above chance
            margin = 3 * math.sqrt(chance * (1 - chance) / n)  # three binomial standard errors at chance
            assert abs(r["ablated"]["value"] - chance) <= margin, (d["mode"], g, r["ablated"]["value"], chance)


def test_mmmt_if_chats_keep_their_image_mapping_and_pair_by_turn(tmp_path):
    """MMMT-IF chats share pictures (chat c shows p{c%4} and p{c+1%4}): a shuffled chat holds none of
    its own pictures in any turn, the same replacement in every turn; without images no turn keeps
    a placeholder; the comparison pairs the turns (PIF, the reference baseline: no difference)."""
    from tests.test_mmmt_if_run import write_mmdu
    cfg = write_mmdu(str(tmp_path / "mmdu"))
    intact, _ = build(cfg, None, dataset="MMMT-IF", formulation="Generation")
    shuffled, _ = build(cfg, "shuffle", dataset="MMMT-IF", formulation="Generation")
    chat_map = {}
    for a, b in zip(intact, shuffled):
        chat = a["meta"]["chat_id"]
        assert set(b["images"]).isdisjoint(a["images"]) and len(b["images"]) == len(a["images"])
        for own, got in zip(a["images"], b["images"]):
            assert chat_map.setdefault((chat, own), got) == got
    blind, _ = build(cfg, "none", dataset="MMMT-IF", formulation="Generation")
    assert all(s["images"] == [] and IMAGE_TOKEN not in ConvProcessor()(s) for s in blind)
    out = tmp_path / "out"
    for mode in (None, "none"):
        _run(out, model="reference", ablation=mode, dataset="MMMT-IF", config=cfg, options={},
             formulation="Generation", do_eval=False)
    comp = score([str(out)], output_dir=str(tmp_path / "report"), quiet=True).comparison
    (dep,) = comp["image_dependence"]
    assert dep["statistic"] == "pif" and dep["n_pairs"] == 30 and dep["mode"] == "none"
    assert dep["rows"][0]["difference"]["value"] == 0.0


@pytest.mark.slow
def test_blip2_runs_blank_when_asked_for_no_images(tmp_path, capsys):
    """End to end: the engine tells the build the family needs an image; the run completes on
    blanks and its results and records say what was done."""
    from tests.conftest import write_custom_dataset
    cfg = write_custom_dataset(str(tmp_path / "data"), n=3)
    res = _run(tmp_path / "out", model="blip2", name="tiny", ablation="none", dataset="custom", config=cfg,
               options={}, method="likelihood")
    summary = json.load(open(res.results_files["json"]))
    assert summary["build_info"]["image_ablation"] == {"requested": "none", "applied": "blank", "samples": 3,
                                                       "images_replaced": 3,
                                                       "reason": "the model cannot run without an image"}
    records = json.load(open(res.prediction_file))
    assert all(r["image_ablation"]["mode"] == "blank" and r["image_ablation"]["requested"] == "none"
               and r["prompt"].count(IMAGE_TOKEN) == 1 for r in records)
