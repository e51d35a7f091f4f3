"""The known-skill model (``--model_name tiny-trained``) has skill, and the suite can see a scrambled signal.

A random model scores at chance whether or not the harness feeds it correctly; this one scores
far above chance on held-out trials, so each deliberately broken build below (frames given to
the wrong sample, images dropped, candidates scored after another sample's prefix, a template
that drops the question) must bring it down to chance. Each break is a monkeypatch of the real
code path for one run; the intact run beside it is the control.
"""
from __future__ import annotations

import json
import os
import sys

import pytest
from PIL import Image

from reform_eval.build.frame_order import write_frame_order_set
from reform_eval.build.mme_synthetic import write_yesno_release
from reform_eval.evaluation import (DatasetConfig, GenerationConfig, ModelConfig, OutputConfig, RunConfig, ScoringConfig,
                        evaluate)
from reform_eval.evaluation.plan import checkpoint_fingerprint
from reform_eval.models import builtin_checkpoint_dir
from reform_eval.models.tiny import SHIPPED_DIR, read_shipped_manifest, sha256_file, shipped_checkpoint, tiny_model_path
from reform_eval.utils.errors import ReformError
from tests.conftest import background_result

TRIALS = 64


def _training():
    """``evaluation.training``, imported by the tests that use it: it loads torch and the LLaVA
    modelling (seconds), and every xdist worker collects this module while one runs each test."""
    from reform_eval.evaluation import training
    return training


def _family():
    """(HFLikelihoodMixin, HFInputsMixin, LlavaInterface): the classes the broken builds patch,
    imported where a test patches them (torch and transformers, as ``_training``)."""
    from reform_eval.models.hf_inputs import HFInputsMixin
    from reform_eval.models.hf_likelihood import HFLikelihoodMixin
    from reform_eval.models.interfaces.llava_interface import LlavaInterface
    return HFLikelihoodMixin, HFInputsMixin, LlavaInterface


def run(tmp_path, config, method="likelihood", formulation="SingleChoice", options=None, batch=8, name="run",
        dataset="iWISDM"):
    """One evaluation through the library (the engine a user's run takes); its headline metrics."""
    cfg = RunConfig(model=ModelConfig("llava", "tiny-trained"),
                    dataset=DatasetConfig(dataset, formulation=formulation, config=config,
                                          options=options if options is not None else {"n_trials": TRIALS}),
                    generation=GenerationConfig(infer_method=method, batch_size=batch, max_new_tokens=6),
                    scoring=ScoringConfig(do_eval=True),
                    output=OutputConfig(output_dir=str(tmp_path / name), use_cache=False))
    return evaluate(cfg).metrics


#: identification with every answer word as a candidate (true/false, locations, categories): only
#: the question says whether a category or a location is asked
BOTH = {"preset": ["identify_category", "identify_location"], "options": "all", "n_trials": TRIALS // 2}


# -- the checkpoint -------------------------------------------------------------------------------
def test_shipped_checkpoint_is_verified_by_hash(tmp_path, monkeypatch):
    training = _training()
    entry = read_shipped_manifest()["llava/trained"]
    assert entry["version"] == training.VERSION and entry["dir"] == SHIPPED_NAME
    path = shipped_checkpoint("llava", "trained")
    assert path == os.path.join(SHIPPED_DIR, SHIPPED_NAME) == tiny_model_path("llava", "trained")
    assert SHIPPED_NAME == training.SHIPPED_NAME
    size = sum(os.path.getsize(os.path.join(path, n)) for n in os.listdir(path))
    assert size < 8 * 2 ** 20, f"the shipped checkpoint is {size} bytes"
    # one changed byte in a copy whose manifest still holds the old hashes: refused (and rebuilt)
    expected = dict(entry["sha256"])
    _shipped_copy(tmp_path, monkeypatch, lambda n, d: d.replace(b'"gelu"', b'"relu"') if n == "config.json" else d)
    manifest = json.loads(open(str(tmp_path / "checkpoints" / "manifest.json")).read())
    manifest["llava/trained"]["sha256"] = expected
    (tmp_path / "checkpoints" / "manifest.json").write_text(json.dumps(manifest))
    assert shipped_checkpoint("llava", "trained") is None


#: bit-for-bit retraining needs the torch version and CPU kernels the shipped files were made with
#: the shipped folder's name (``evaluation.training.SHIPPED_NAME``, checked equal in the first test)
SHIPPED_NAME = "llava-tiny-trained"
BUILT_WITH = (read_shipped_manifest().get("llava/trained") or {}).get("built_with")


class _OffTheShippingPlatform:
    """A ``skipif`` condition read only when pytest (or the background jobs' start) asks: this
    machine is not the platform the shipped files were made on (``build_platform`` imports torch)."""

    def __bool__(self) -> bool:
        return BUILT_WITH != _training().build_platform()


OFF_PLATFORM = pytest.mark.skipif(_OffTheShippingPlatform(), reason=(
    f"bit-for-bit retraining needs the shipping platform {BUILT_WITH} (a manifest without 'isa' does not "
    "say which CPU extensions made it); this machine is another"))


def _shipped_copy(tmp_path, monkeypatch, change=None):
    """A copy of the shipped folder and manifest under tmp_path (``change(name, bytes) -> bytes``
    edits a file; the manifest records the edited hashes), made the shipped one for this test."""
    entry = read_shipped_manifest()["llava/trained"]
    src = os.path.join(SHIPPED_DIR, SHIPPED_NAME)
    dst = tmp_path / "checkpoints" / SHIPPED_NAME
    dst.mkdir(parents=True)
    for n in os.listdir(src):
        data = open(os.path.join(src, n), "rb").read()
        (dst / n).write_bytes(change(n, data) if change else data)
    entry = dict(entry, sha256={n: sha256_file(str(dst / n)) for n in os.listdir(dst)})
    (tmp_path / "checkpoints" / "manifest.json").write_text(json.dumps({"llava/trained": entry}))
    monkeypatch.setattr("reform_eval.models.tiny.SHIPPED_DIR", str(tmp_path / "checkpoints"))
    monkeypatch.setattr("reform_eval.models.tiny.SHIPPED_MANIFEST", str(tmp_path / "checkpoints" / "manifest.json"))
    return str(dst)


def test_new_shipped_weights_are_a_new_run_identity(tmp_path, monkeypatch):
    """The name stays 'tiny-trained' while its weights may change: the run identity holds their content."""
    model = ModelConfig("llava", "tiny-trained")
    before = checkpoint_fingerprint(model)
    assert before and {n for n, _, _ in before} == set(read_shipped_manifest()["llava/trained"]["sha256"])
    _shipped_copy(tmp_path, monkeypatch)
    assert checkpoint_fingerprint(model) == before  # the same bytes elsewhere: the same run
    monkeypatch.undo()
    _shipped_copy(tmp_path / "b", monkeypatch, lambda n, d: d[:-8] + bytes(8) if n == "model.safetensors" else d)
    assert checkpoint_fingerprint(model) != before


def test_a_damaged_manifest_never_stops_the_other_tiny_models(tmp_path, monkeypatch, caplog):
    path = tmp_path / "manifest.json"
    path.write_text('{"llava/trained": {"dir": ')
    monkeypatch.setattr("reform_eval.models.tiny.SHIPPED_MANIFEST", str(path))
    assert read_shipped_manifest() == {} and "cannot be read" in caplog.text
    assert os.path.isdir(tiny_model_path("llava", "tiny"))
    path.write_text('{"llava/trained": {"version": "1"}}')
    assert shipped_checkpoint("llava", "trained") is None and "lacks dir" in caplog.text


def test_wrong_uses_of_the_name_are_one_clear_line():
    with pytest.raises(ReformError, match=r"--model llava only, not --model qwen2_vl"):
        builtin_checkpoint_dir("qwen2_vl", "tiny-trained", {})
    with pytest.raises(ReformError, match=r"tiny_size applies to --model_name tiny"):
        builtin_checkpoint_dir("llava", "tiny-trained", {"tiny_size": "bench"})


@pytest.mark.slow
@OFF_PLATFORM
@pytest.mark.background(sys.executable, "-m", "reform_eval.evaluation.train_known_skill", "--check")
def test_the_recipe_start_retrained_matches_what_the_shipping_run_recorded(request):
    """The suite's reproducibility check (about 2 CPU minutes, in the background after collection):
    the shipped files match the manifest, and the data, the pretrained tower and the weights after
    CHECK_STEPS language-model steps, retrained now, hash to what the run that made those files
    recorded (``--check``; the full retraining is the opt-in test below)."""
    rc, out, err, _work = background_result(request)
    assert rc == 0, err[-3000:]
    for stage in ("data", "vision", "check"):
        assert f"stage {stage}: " in out and "matches" in out, out
    assert f"{_training().CHECK_STEPS} language-model steps match" in out


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("REFORM_FULL_RETRAIN"),
                    reason="the full retraining (about 7 CPU minutes) runs with REFORM_FULL_RETRAIN=1")
@OFF_PLATFORM
@pytest.mark.background(sys.executable, "-m", "reform_eval.evaluation.train_known_skill", "--out", "{tmp}/rebuilt")
def test_training_rebuilds_the_shipped_checkpoint_file_for_file(request):
    """The shipped weights are what ``python -m reform_eval.evaluation.train_known_skill`` produces (deterministic)."""
    rc, _out, err, work = background_result(request)
    assert rc == 0, err[-3000:]
    out = os.path.join(work, "rebuilt")
    expected = read_shipped_manifest()["llava/trained"]["sha256"]
    got = {n: sha256_file(os.path.join(out, n)) for n in sorted(os.listdir(out))}
    assert got == expected


def test_the_check_names_the_first_stage_that_differs(monkeypatch, capsys):
    """The comparison of ``--check`` (the retraining itself replaced by the manifest's own records,
    one of them changed): a match passes, any changed record fails and is named."""
    from reform_eval.evaluation import train_known_skill

    stages = read_shipped_manifest()["llava/trained"]["stages"]
    recorded = [r for r in stages if r["name"] in ("data", "vision", "check")]
    assert [r["name"] for r in recorded] == ["data", "vision", "check"] and recorded[-1]["steps"] == _training().CHECK_STEPS
    for changed in (None, "data", "vision", "check"):
        got = [dict(r, sha256="0" * 64) if r["name"] == changed else dict(r) for r in recorded]
        monkeypatch.setattr(train_known_skill, "build_trained_llava", lambda out, stop_after=None, got=got: got)
        rc = train_known_skill.main(["--check"])
        text = capsys.readouterr()
        assert rc == (0 if changed is None else 1), text
        if changed:
            assert f"stage {changed}: retrained" in text.err


def test_the_check_refuses_a_changed_shipped_file(tmp_path, monkeypatch, capsys):
    from reform_eval.evaluation import train_known_skill

    _shipped_copy(tmp_path, monkeypatch)
    entry = read_shipped_manifest()["llava/trained"]
    weights = os.path.join(str(tmp_path / "checkpoints" / SHIPPED_NAME), "model.safetensors")
    with open(weights, "r+b") as f:
        f.seek(-4, 2)
        f.write(bytes(4))
    assert entry["sha256"]["model.safetensors"] != sha256_file(weights)
    monkeypatch.setattr(train_known_skill, "build_trained_llava", lambda *a, **k: pytest.fail("retrained"))
    assert train_known_skill.main(["--check"]) == 1
    assert "does not match" in capsys.readouterr().err


# -- skill, and the broken builds that must erase it ------------------------------------------------
def test_identifies_category_and_location_far_above_chance(tmp_path):
    assert run(tmp_path, "iwisdm_identify_category", name="c")["accuracy"] >= 0.9   # chance 0.125
    assert run(tmp_path, "iwisdm_identify_location", name="l")["accuracy"] >= 0.9   # chance 0.25
    gen = run(tmp_path, "iwisdm_identify_category", method="generation", name="g")
    assert gen["format_hit_rate"] >= 0.95 and gen["accuracy"] >= 0.85


def _acc_plus(metrics):
    """acc+ over all images of the yes/no set: both questions of an image answered right."""
    subs = metrics["subtasks"].values()
    return sum(s["acc_plus"] * s["num_images"] for s in subs) / sum(s["num_images"] for s in subs)


def _swap_question_files(root):
    """Exchange the question files of images i and i + 4 in every block of 8 images of each subtask:
    the generator cycles shapes every image and colours every 3, so the two images differ in both,
    and each image's Yes question is false of the other image."""
    for sub in sorted(os.listdir(root)):
        folder = os.path.join(root, sub)
        stems = sorted(n[:-4] for n in os.listdir(folder) if n.endswith(".txt"))
        for start in range(0, len(stems) - 7, 8):
            for i in range(start, start + 4):
                a, b = (os.path.join(folder, stems[k] + ".txt") for k in (i, i + 4))
                text_a, text_b = open(a, encoding="utf-8").read(), open(b, encoding="utf-8").read()
                open(a, "w", encoding="utf-8").write(text_b)
                open(b, "w", encoding="utf-8").write(text_a)


@pytest.mark.slow  # (quick subset: test_images_dropped_fall_to_chance covers the path)
def test_yes_no_questions_swapped_between_images_lose_acc_plus(tmp_path):
    """The yes/no set is learnt: both questions of an image (one Yes, one No) answered right. With
    the two questions of each image swapped with another image's (the answer key unchanged), the
    Yes question no longer holds of the image it is asked of, and acc+ falls."""
    root = write_yesno_release(str(tmp_path / "yesno"), n_images=32, seed=5)
    ok = run(tmp_path, "mme_synthetic", formulation="Generation", options={"root": root}, dataset="MME", name="ok")
    assert ok["num_records"] == 128 and ok["accuracy"] >= 0.8 and _acc_plus(ok) >= 0.6, ok
    _swap_question_files(root)
    broken = run(tmp_path, "mme_synthetic", formulation="Generation", options={"root": root}, dataset="MME",
                 name="broken")
    assert broken["num_records"] == 128 and _acc_plus(broken) <= 0.2, broken


def _rotate(items):
    return list(items[1:]) + list(items[:1])


@pytest.mark.slow  # (quick subset: test_images_dropped_fall_to_chance covers the path)
def test_frames_given_to_the_wrong_sample_fall_to_chance(tmp_path, monkeypatch):
    """Images misaligned with their questions inside a batch (rotated by one sample)."""
    assert run(tmp_path, "iwisdm_identify_category", name="ok")["accuracy"] >= 0.9
    HFLikelihoodMixin, HFInputsMixin, LlavaInterface = _family()
    original = HFLikelihoodMixin.raw_batch_predict

    def misaligned(self, images_list, prompts, candidates_list):
        return original(self, _rotate(images_list), prompts, candidates_list)
    monkeypatch.setattr(LlavaInterface, "raw_batch_predict", misaligned, raising=False)
    assert run(tmp_path, "iwisdm_identify_category", name="broken")["accuracy"] <= 0.3


@pytest.mark.slow  # (quick subset: test_images_dropped_fall_to_chance covers the path)
def test_frames_in_reverse_order_fall_to_chance(tmp_path, monkeypatch):
    """Frames of one sample reversed: asked for the second frame's object, the model reads the
    first's (``build.frame_order``: the two objects always differ in category)."""
    config = write_frame_order_set(str(tmp_path / "frames"), n=TRIALS, seed=11)
    assert run(tmp_path, config, name="ok", options={}, dataset="custom")["accuracy"] >= 0.8
    HFLikelihoodMixin, HFInputsMixin, LlavaInterface = _family()
    original = HFInputsMixin._images

    def reversed_frames(self, images, i):
        return list(reversed(original(self, images, i)))
    monkeypatch.setattr(LlavaInterface, "_images", reversed_frames, raising=False)
    assert run(tmp_path, config, name="broken", options={}, dataset="custom")["accuracy"] <= 0.2


@pytest.mark.slow  # (quick subset: test_images_dropped_fall_to_chance covers the path)
def test_a_frame_of_another_trial_brings_the_two_frame_comparison_to_chance(tmp_path, monkeypatch):
    """Delayed match to sample (is the first object's category the second's?): with the first
    object's frame replaced by another trial's (the next sample's in the batch), the answer no
    longer follows from the frames, so accuracy falls to chance (0.5)."""
    options = {"n_trials": TRIALS * 2, "n_delay": 1}
    assert run(tmp_path, "iwisdm_dms_category_delays", name="ok", options=options)["accuracy"] >= 0.7
    HFLikelihoodMixin, HFInputsMixin, LlavaInterface = _family()
    original = HFLikelihoodMixin.raw_batch_predict

    def other_first_frame(self, images_list, prompts, candidates_list):
        firsts = _rotate([images[:1] for images in images_list])
        return original(self, [first + list(images[1:]) for first, images in zip(firsts, images_list)], prompts,
                        candidates_list)
    monkeypatch.setattr(LlavaInterface, "raw_batch_predict", other_first_frame, raising=False)
    assert 0.35 <= run(tmp_path, "iwisdm_dms_category_delays", name="broken", options=options)["accuracy"] <= 0.62


def test_images_dropped_fall_to_chance(tmp_path, monkeypatch):
    HFLikelihoodMixin, HFInputsMixin, LlavaInterface = _family()
    original = HFInputsMixin._images

    def blank(self, images, i):
        return [Image.new("RGB", im.size) for im in original(self, images, i)]
    monkeypatch.setattr(LlavaInterface, "_images", blank, raising=False)
    assert run(tmp_path, "iwisdm_identify_category", name="blank")["accuracy"] <= 0.3
    assert run(tmp_path, "iwisdm_identify_location", name="blank_l")["accuracy"] <= 0.45


@pytest.mark.slow  # (quick subset: test_images_dropped_fall_to_chance covers the path)
def test_candidates_scored_after_another_samples_prefix_fall_to_chance(tmp_path, monkeypatch):
    HFLikelihoodMixin, HFInputsMixin, LlavaInterface = _family()
    original = HFLikelihoodMixin.raw_batch_predict

    def wrong_prefix(self, images_list, prompts, candidates_list):
        return original(self, _rotate(images_list), _rotate(prompts), candidates_list)
    monkeypatch.setattr(LlavaInterface, "raw_batch_predict", wrong_prefix, raising=False)
    assert run(tmp_path, "iwisdm_identify_category", name="broken")["accuracy"] <= 0.3


@pytest.mark.slow  # (quick subset: test_images_dropped_fall_to_chance covers the path)
def test_template_without_the_question_falls_to_chance(tmp_path, monkeypatch):
    """Category and location questions with every answer word offered (chance 1/14): without the
    question the image alone cannot say which of the object's features is asked. The task
    description goes too: it lists the answers the question allows (categories, or locations),
    and the model reads it (it was trained with and without it)."""
    assert run(tmp_path, "iwisdm_identify_category", name="ok", options=BOTH)["accuracy"] >= 0.9
    LlavaInterface = _family()[2]
    make = LlavaInterface.make_preprocessor

    def no_question(self, config):
        pre = make(self, config)

        def render(sample):
            images = "".join("<image>" for _ in sample["images"])
            return pre(dict(sample, instruct="", question=images, question_with_option=images))
        return render
    monkeypatch.setattr(LlavaInterface, "make_preprocessor", no_question)
    # half the items ask for a category and half for a location: an answer that does not depend on
    # the question names the right feature for about half of them (measured: 0.578 of 64, the category
    # of nearly every category item and true/false for most location items); two binomial standard
    # errors above 0.5
    assert run(tmp_path, "iwisdm_identify_category", name="broken", options=BOTH)["accuracy"] <= 0.625


# -- the synthetic yes/no set -------------------------------------------------------------------------
def test_yes_no_set_is_mme_shaped_and_deterministic(tmp_path):
    from reform_eval.build import load_reform_dataset
    a = write_yesno_release(str(tmp_path / "a"), n_images=6, seed=3)
    b = write_yesno_release(str(tmp_path / "b"), n_images=6, seed=3)
    for sub in ("existence", "color"):
        names = sorted(os.listdir(os.path.join(a, sub)))
        assert len(names) == 12 and names == sorted(os.listdir(os.path.join(b, sub)))
        for n in names:
            assert open(os.path.join(a, sub, n), "rb").read() == open(os.path.join(b, sub, n), "rb").read()
    ds = load_reform_dataset("MME", "Generation", dataset_config="mme_synthetic", root=a)
    assert len(ds) == 24
    by_image = {}
    for i in range(len(ds)):
        s = ds[i]
        assert s["question"].endswith("Please answer yes or no.") and s["candidates"] == ["Yes", "No"]
        by_image.setdefault(s["meta"]["image"], []).append(s["answer"])
    # MME's pairing: every image has one Yes and one No question (what acc+ needs)
    assert all(sorted(v) == ["No", "Yes"] for v in by_image.values()) and len(by_image) == 12


def test_yes_no_answers_agree_with_the_pixels(tmp_path):
    """The 'Yes' question names the drawn colour: the image's brightest pixels have that colour."""
    from reform_eval.build.mme_synthetic import COLOURS
    root = write_yesno_release(str(tmp_path / "y"), n_images=8, seed=4)
    rgb = dict(COLOURS)
    for n in sorted(os.listdir(os.path.join(root, "color"))):
        if not n.endswith(".txt"):
            continue
        rows = [line.split("\t") for line in open(os.path.join(root, "color", n)).read().splitlines()]
        (yes,) = [q for q, a in rows if a == "Yes"]
        colour = yes.split(" in the image ")[1].split("?")[0]
        im = Image.open(os.path.join(root, "color", n[:-4] + ".png")).convert("RGB")
        counts = im.getcolors(1 << 16)
        drawn = max((c for c in counts if c[1] != (30, 30, 30)), key=lambda c: c[0])[1]
        assert drawn == rgb[colour], (n, yes, drawn)
