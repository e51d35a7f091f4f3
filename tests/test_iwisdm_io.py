"""iWISDM trials in and out of the original iwisdm 0.1.3 layout, and safe stimulus metadata.

The original writes ``trial_<k>/frames/epoch<i>.png`` + ``frames/task_info.json`` (objects with
grid cells and integer codes, one answer per frame with "null" where none is due). A
hand-written folder tests the importer everywhere; trials made by the original itself are
tested where its venv exists (bench/iwisdm_gen.py creates it under $REFORM_CACHE).
"""
from __future__ import annotations

import csv
import json
import os
import pickle
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from reform_eval.build import build_dataset
from reform_eval.build.iwisdm import generate_trials, read_trials, write_trials
from reform_eval.build.iwisdm.instructions import InstructionError, InstructionParser, evaluate_instruction
from reform_eval.build.iwisdm.io import is_original_dir, original_task_info
from reform_eval.build.iwisdm.stimuli import DirectoryStimuli, ProceduralStimuli, procedural_set
from tests.test_iwisdm import ORIG_PYTHON  # the venv bench/iwisdm_gen.py creates (or IWISDM_ORIG_PYTHON)
from reform_eval.utils.errors import ReformError
from reform_eval.utils.images import open_image

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STIM = procedural_set()
CATS = STIM.categories  # codes: benches 0, boats 1, cars 2, chairs 3, couches 4, lighting 5, planes 6, tables 7


def _obj(count, epoch, ctg, obj, ang, space=None, location=None, distractor=False):
    o = {"category": ctg, "object": obj, "view angle": ang, "epochs": epoch, "is_distractor": distractor}
    if space is not None:
        o["space"] = space
        o["location"] = f"({0.25 + 0.5 * space[0]}, {0.25 + 0.5 * space[1]})"
    if location is not None:
        o["location"] = location
    return {"count": count, "obj": o, "tasks": [0], "attended_attr": {"0": ["location"]}}


#: two trials as iwisdm 0.1.3's write_trial lays them out (its key names and value forms)
FIXTURE = {
    "trial_0": {"epochs": 3, "instruction": "observe object 1, delay, observe object 2 with category: cars, "
                                            "location of object 2 equals location of object 1?",
                "objects": [_obj(1, 0, 4, 2, 1, space=[1, 0]),
                            _obj(2, 2, 2, 5, 0, space=[0, 1]),
                            _obj(2, 2, 6, 1, 3, space=[1, 1], distractor=True)],
                "answers": ["null", "null", "false"]},
    "trial_1": {"epochs": 2, "instruction": "observe object 1, observe object 2, if category of object 2 equals "
                                            "category of object 1, then location of object 2? else location of "
                                            "object 1?",
                # no grid cell: the quadrant comes from the centre "(x, y)"
                "objects": [_obj(1, 0, 7, 0, 2, location="(0.21, 0.83)"), _obj(2, 1, 7, 3, 0, location="(0.7, 0.1)")],
                "answers": ["null", "top right"]},
}


def write_fixture(root, trials=FIXTURE):
    for name, info in trials.items():
        d = os.path.join(root, name, "frames")
        os.makedirs(d, exist_ok=True)
        for i in range(info["epochs"]):
            Image.new("RGB", (224, 224), (10 * i, 20, 30)).save(os.path.join(d, f"epoch{i}.png"))
        with open(os.path.join(d, "task_info.json"), "w") as f:
            json.dump(info, f, indent=4)
    return str(root)


def test_original_fixture_imports_exactly(tmp_path):
    root = write_fixture(tmp_path / "orig")
    assert is_original_dir(root)
    index, rows = read_trials(root)
    assert index["format"] == "iwisdm-original" and [r[0] for r in rows] == ["trial_0", "trial_1"]
    (_, t0, p0), (_, t1, p1) = rows
    assert t0.frames == [[{"category": "couches", "identity": 2, "view": 1, "location": "top right"}], [],
                         [{"category": "cars", "identity": 5, "view": 0, "location": "bottom left"},
                          {"category": "planes", "identity": 1, "view": 3, "location": "bottom right",
                           "distractor": True}]]
    assert (t0.actions, t0.answer, t0.response_type) == ([None, None, "false"], "false", "bool")
    assert t1.frames == [[{"category": "tables", "identity": 0, "view": 2, "location": "bottom left"}],
                         [{"category": "tables", "identity": 3, "view": 0, "location": "top right"}]]
    assert (t1.answer, t1.response_type) == ("top right", "location")
    assert p0 == [os.path.join(root, "trial_0", "frames", f"epoch{i}.png") for i in range(3)]
    m = t0.meta
    assert (m["n_frames"], m["n_stimuli"], m["n_delay"], m["n_distractors"]) == (3, 2, 1, 1)
    assert (m["n_is_same"], m["n_not_same"], m["n_and"], m["n_or"], m["n_switch"]) == (1, 0, 0, 0, 0)
    assert m["features"] == ["location"] and t1.meta["features"] == ["category", "location"]
    assert t1.meta["n_switch"] == 1
    # the instruction parser reads the frames to the original's answers
    for _, t, _ in rows:
        assert evaluate_instruction(t.instruction, t.frames, CATS) == t.answer


def test_original_fixture_through_the_builder(tmp_path):
    root = write_fixture(tmp_path / "orig")
    s, _ = build_dataset("iWISDM", "SingleChoice", {"trial_dir": root}, seed=0, shuffle_options=False)
    assert [x["sample_id"] for x in s] == ["trial_0", "trial_1"]
    assert s[0]["images"] == [os.path.join(root, "trial_0", "frames", f"epoch{i}.png") for i in range(3)]
    assert s[0]["answer_options"] == ["true", "false"] and s[0]["answer"] == 1
    # a Switch between two location getters offers the four locations
    assert s[1]["answer_options"] == ["bottom right", "bottom left", "top left", "top right"]
    assert s[1]["answer_options"][s[1]["answer"]] == "top right"
    assert {x["meta"]["complexity"] for x in s} == {"original"}
    g, _ = build_dataset("iWISDM", "Generation", {"trial_dir": root, "preset": "high"}, seed=0)
    assert g[1]["answer"] == "top right" and g[1]["meta"]["complexity"] == "high"
    assert g[0]["question"].count("<image>") == 3


@pytest.mark.parametrize("edit,match", [
    (lambda i: i["objects"][0]["obj"].update(category=9), r"trial_0/frames/task_info\.json: record 0: field 'category'"
                                                         r".*not in the stimulus set.*stim_dir"),
    (lambda i: i["objects"][1]["obj"].update(space=[2, 0]), r"record 1: field 'space'.*outside the 2x2 grid"),
    (lambda i: i["objects"][0]["obj"].update(object="2"), r"record 0: field 'object'.*integer code"),
    (lambda i: i["objects"][2]["obj"].update(epochs=7), r"record 2: field 'epochs'"),
    (lambda i: i.update(answers=["null", "null"]), r"field 'answers'.*2 answers for 3 epochs"),
    (lambda i: i.update(answers=["null", "null", "null"]), r"field 'answers'.*no answer is due"),
    (lambda i: i.update(answers=["null", "null", "purple"]), r"field 'answers'.*'purple'"),
    (lambda i: i.pop("instruction"), r"field 'instruction'"),
])
def test_original_import_errors_name_file_record_field(tmp_path, edit, match):
    info = json.loads(json.dumps(FIXTURE["trial_0"]))
    edit(info)
    root = write_fixture(tmp_path / "orig", {"trial_0": info})
    with pytest.raises(ReformError, match=match):
        read_trials(root)


def test_original_import_missing_frame_and_empty_dir(tmp_path):
    root = write_fixture(tmp_path / "orig")
    os.remove(os.path.join(root, "trial_1", "frames", "epoch1.png"))
    with pytest.raises(ReformError, match=r"trial_1/frames/epoch1\.png: field 'epochs': frame image missing"):
        read_trials(root)
    os.makedirs(tmp_path / "empty")
    with pytest.raises(ReformError, match=r"empty: field 'trial_dir': neither index\.json.*trial_<k>"):
        build_dataset("iWISDM", "SingleChoice", {"trial_dir": str(tmp_path / "empty")})


def _same_trials(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert (x.instruction, x.frames, x.actions, x.answer, x.response_type) == \
            (y.instruction, y.frames, y.actions, y.answer, y.response_type)


def test_export_original_round_trip(tmp_path):
    trials = generate_trials("high", 24, 3, STIM, n_distractors=1)
    dirs = write_trials(str(tmp_path / "orig"), trials, STIM, format="original")
    assert dirs == [str(tmp_path / "orig" / f"trial_{k}") for k in range(24)]
    assert sorted(os.listdir(dirs[0] + "/frames")) == sorted(
        [f"epoch{i}.png" for i in range(len(trials[0][2].frames))] + ["task_info.json"])
    index, back = read_trials(str(tmp_path / "orig"))
    assert len(back) == 24
    _same_trials([t[2] for t in trials], [t[1] for t in back])
    for (_, _, tr), (_, tb, paths) in zip(trials, back):
        for key in ("n_frames", "n_stimuli", "n_delay", "n_distractors", "n_and", "n_or", "n_is_same",
                    "n_not_same", "n_switch", "features"):
            assert tb.meta[key] == tr.meta[key], key
        for im, p in zip(tr.render(STIM), paths):
            assert np.array_equal(np.asarray(im), np.asarray(open_image(p)))
    # exporting the imported trials again writes the same task_info.json files
    write_trials(str(tmp_path / "again"), [(t, None, tr) for t, tr, _ in back], STIM, format="original")
    for k in range(24):
        rel = os.path.join(f"trial_{k}", "frames", "task_info.json")
        with open(tmp_path / "orig" / rel) as f, open(tmp_path / "again" / rel) as g:
            assert json.load(f) == json.load(g)
    with pytest.raises(ReformError, match="unknown trial format 'zip'"):
        write_trials(str(tmp_path / "x"), trials, STIM, format="zip")


def test_export_original_codes_follow_the_stimulus_set(tmp_path):
    """With an imported stimulus directory the integer codes are its ctg_mod/obj_mod/ang_mod."""
    small = ProceduralStimuli(categories=("cars", "planes", "tables"), n_identities=2)
    split = small.export(str(tmp_path / "stim"), "train")
    with open(os.path.join(split, "train_metadata.csv")) as f:
        rows = list(csv.DictReader(f))
    for r in rows:  # renumber the codes: categories 10, 20, 30; objects 5, 6; views 0, 2, 4, 6
        r["ctg_mod"] = str(10 * (int(r["ctg_mod"]) + 1))
        r["obj_mod"] = str(int(r["obj_mod"]) + 5)
        r["ang_mod"] = str(2 * int(r["ang_mod"]))
    with open(os.path.join(split, "train_metadata.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    stim = DirectoryStimuli(str(tmp_path / "stim"))
    trials = generate_trials("dms_category", 6, 0, stim)
    write_trials(str(tmp_path / "orig"), trials, stim, format="original")
    info = original_task_info(trials[0][2], stim)
    o = next(o for f in trials[0][2].frames for o in f)
    first = info["objects"][0]["obj"]
    assert first["category"] == 10 * (stim.categories.index(o["category"]) + 1)
    assert (first["object"], first["view angle"]) == (o["identity"] + 5, 2 * o["view"])
    _, back = read_trials(str(tmp_path / "orig"), stim)
    _same_trials([t[2] for t in trials], [t[1] for t in back])
    s, _ = build_dataset("iWISDM", "SingleChoice", {"trial_dir": str(tmp_path / "orig"),
                                                    "stim_dir": str(tmp_path / "stim")})
    assert [x["sample_id"] for x in s] == [f"trial_{k}" for k in range(6)]


# -- stimulus metadata: no code execution from data -------------------------------------------------
class _Boom:
    """Unpickling this creates a file: proof that a pickle ran code."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _pickle_dir(root, marker, with_csv=False):
    split = procedural_set().export(str(root), "train") if with_csv else str(root / "train")
    os.makedirs(split, exist_ok=True)
    if not with_csv:
        os.makedirs(os.path.join(split, "0"), exist_ok=True)
    with open(os.path.join(split, "meta.pkl"), "wb") as f:
        pickle.dump(_Boom(marker), f)
    return split


def test_pickle_metadata_is_refused_by_default(tmp_path):
    marker = str(tmp_path / "PWNED")
    _pickle_dir(tmp_path / "stim", marker)
    with pytest.raises(ReformError, match=r"meta\.pkl: field 'allow_pickle': refusing to unpickle.*arbitrary code"):
        DirectoryStimuli(str(tmp_path / "stim"))
    cfg = tmp_path / "iwisdm_pkl.yaml"
    cfg.write_text("preset: low\nn_trials: 2\nstim_dir: stim\n")
    with pytest.raises(ReformError, match=r"meta\.pkl: field 'allow_pickle'"):
        build_dataset("iWISDM", "SingleChoice", str(cfg))
    assert not os.path.exists(marker)
    # a CSV beside the pickle is read and the pickle never opened
    _pickle_dir(tmp_path / "both", marker, with_csv=True)
    assert DirectoryStimuli(str(tmp_path / "both")).categories == CATS
    cfg.write_text("preset: low\nn_trials: 2\nstim_dir: both\nallow_pickle: true\n")
    assert len(build_dataset("iWISDM", "SingleChoice", str(cfg))[0]) == 2
    assert not os.path.exists(marker)
    # the explicit opt-in unpickles (here: runs the crafted code), as documented
    cfg.write_text("preset: low\nn_trials: 2\nstim_dir: stim\nallow_pickle: true\n")
    with pytest.raises(ReformError, match="must hold a pandas DataFrame"):
        build_dataset("iWISDM", "SingleChoice", str(cfg))
    assert os.path.exists(marker)


def test_json_metadata_reads_like_csv(tmp_path):
    split = ProceduralStimuli(categories=("cars", "planes"), n_identities=2).export(str(tmp_path / "a"), "val")
    with open(os.path.join(split, "val_metadata.csv")) as f:
        rows = [{k: (v if k == "ctg" else int(v)) for k, v in r.items()} for r in csv.DictReader(f)]
    os.remove(os.path.join(split, "val_metadata.csv"))
    for form in ("records", "columns"):
        obj = rows if form == "records" else {c: {str(r["ref"]): r[c] for r in rows} for c in rows[0] if c != "ref"}
        with open(os.path.join(split, "val_metadata.json"), "w") as f:
            json.dump(obj, f)
        stim = DirectoryStimuli(str(tmp_path / "a"))
        assert stim.categories == ("cars", "planes") and (stim.n_identities, stim.n_views) == (2, 4)
        assert stim.codes("planes", 1, 3) == (1, 1, 3)
    with open(os.path.join(split, "val_metadata.json"), "w") as f:
        json.dump([{"ref": 0, "ctg_mod": 0}], f)
    with pytest.raises(ReformError, match=r"val_metadata\.json: field 'obj_mod'"):
        DirectoryStimuli(str(tmp_path / "a"))


# -- trials made by the original iwisdm 0.1.3 -----------------------------------------------------

#: runs in the original's venv: the benchmark configs of bench/iwisdm_gen.py, its acceptance rule,
#: fixation cues, a distractor on every second trial; each trial written by the original's write_trial
ORIG_WRITER = r'''
import copy, json, os, random, sys
import numpy as np
from iwisdm import make
from iwisdm.utils.read_write import write_trial
cfg = json.load(open(sys.argv[1]))
random.seed(cfg["seed"]); np.random.seed(cfg["seed"])
env = make(env_id="ShapeNet", dataset_fp=cfg["stim_dir"])
default_gen = env.init_env_spec().auto_gen_config
for preset, p in cfg["presets"].items():
    rule, conf = p["accept"], dict(p["config"])
    gen = copy.deepcopy(default_gen)
    children, dist = conf.pop("cmp_children"), conf.pop("cmp_dist")
    gen.update(conf)
    for op in ("IsSame", "NotSame"):
        gen["op_dict"][op]["downstream"] = list(children)
        gen["op_dict"][op].pop("sample_dist", None)
        if dist:
            gen["op_dict"][op]["sample_dist"] = list(dist)
    gen["op_dict"]["Select"]["same_children_op"] = True
    env.set_env_spec(env.init_env_spec(max_delay=rule["max_delay"], delay_prob=0.5, add_fixation_cue=True,
                                       auto_gen_config=gen))
    k = tries = 0
    while k < cfg["n"] and tries < cfg["n"] * 300:
        tries += 1
        try:
            _, (_, task) = env.generate_tasks(1)[0]
            if task.n_frames != rule["frames"]:
                continue
            imgs, _, info = env.generate_trials(tasks=[task], mode="train", add_distractor_frame=k % 2)[0]
        except Exception:
            continue
        ins = info["instruction"]
        n_bool = ins.count(" and ") + ins.count(" or ")
        n_delay = task.n_frames - ins.count("observe")
        if (rule["min_bool"] <= n_bool <= rule["max_bool"] and rule["min_delay"] <= n_delay <= rule["max_delay"]
                and len(imgs) == rule["frames"]):
            write_trial(imgs, info, os.path.join(cfg["out"], preset, "trial_%d" % k))
            k += 1
    print(preset, k, tries)
'''

#: an instruction in the original's own wording: a delay run, "at location", a constant first
ORIGINAL_WORDING = ("observe object 1 at location: top left, delay, observe object 2, "
                    "bottom right equals location of object 2?")
ORIGINAL_WORDING_FRAMES = [[{"category": "cars", "identity": 0, "view": 0, "location": "top left"},
                            {"category": "boats", "identity": 1, "view": 0, "location": "top right",
                             "distractor": True}], [], [],
                           [{"category": "tables", "identity": 0, "view": 0, "location": "bottom right"}]]


def _parser_reads_original_wording() -> bool:
    try:
        return evaluate_instruction(ORIGINAL_WORDING, ORIGINAL_WORDING_FRAMES, CATS) == "true"
    except InstructionError:
        return False


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists(ORIG_PYTHON), reason=f"no venv with the original iwisdm==0.1.3 at "
                    f"{ORIG_PYTHON} (python bench/iwisdm_gen.py creates it; or set IWISDM_ORIG_PYTHON)")
def test_trials_made_by_the_original_import_with_its_answers(tmp_path):
    if not _parser_reads_original_wording():
        pytest.skip("the instruction parser does not read the original's wording yet "
                    "(delay runs, 'at location', constant first)")
    sys.path.insert(0, ROOT)
    from bench.iwisdm_gen import ACCEPT, ORIG_CONFIG
    STIM.export(str(tmp_path / "stim"), "train")
    n = 40
    cfg = {"seed": 0, "n": n, "stim_dir": str(tmp_path / "stim"), "out": str(tmp_path / "orig"),
           "presets": {p: {"accept": ACCEPT[p], "config": ORIG_CONFIG[p]} for p in ("low", "medium", "high")}}
    (tmp_path / "cfg.json").write_text(json.dumps(cfg))
    (tmp_path / "writer.py").write_text(ORIG_WRITER)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON") and k != "VIRTUAL_ENV"}
    res = subprocess.run([ORIG_PYTHON, "-I", str(tmp_path / "writer.py"), str(tmp_path / "cfg.json")],
                         capture_output=True, text=True, timeout=600, cwd=str(tmp_path), env=env)
    if "No module named 'iwisdm'" in res.stderr:
        pytest.skip(f"{ORIG_PYTHON} has no iwisdm")
    assert res.returncode == 0, res.stderr[-2000:]
    parser = InstructionParser(CATS)
    for preset in ("low", "medium", "high"):
        d = str(tmp_path / "orig" / preset)
        _, rows = read_trials(d)
        assert len(rows) == n, res.stdout
        assert sum(any(o.get("distractor") for f in t.frames for o in f) for _, t, _ in rows) >= n // 4
        disagree = [(tid, t.instruction, t.answer) for tid, t, _ in rows
                    if parser.evaluate(t.instruction, t.frames)[-1] != t.answer]
        assert not disagree, f"{preset}: {len(disagree)}/{n} disagree, e.g. {disagree[0]}"
        # round trip: the imported trials exported again give the original's task_info.json content
        write_trials(str(tmp_path / "again" / preset), [(tid, None, t) for tid, t, _ in rows], STIM,
                     format="original")
        _, again = read_trials(str(tmp_path / "again" / preset))
        _same_trials([t[1] for t in rows], [t[1] for t in again])
        for tid, _, _ in rows:
            with open(os.path.join(d, tid, "frames", "task_info.json")) as f, \
                    open(tmp_path / "again" / preset / tid / "frames" / "task_info.json") as g:
                a, b = json.load(f), json.load(g)
            assert (a["epochs"], a["instruction"], a["answers"]) == (b["epochs"], b["instruction"], b["answers"])
            key = ("category", "object", "view angle", "space", "epochs", "is_distractor")
            assert [[o["obj"][k] for k in key] for o in a["objects"]] == [[o["obj"][k] for k in key]
                                                                           for o in b["objects"]]
        s, _ = build_dataset("iWISDM", "SingleChoice", {"trial_dir": d, "preset": preset}, seed=0)
        assert [x["answer_options"][x["answer"]] for x in s] == [t.answer for _, t, _ in rows]


@pytest.mark.parametrize("edit,match", [
    (lambda r: r.update(frames="abc"), r"trial\.json: field 'frames': must be a list, got str"),
    (lambda r: r.update(meta="x"), r"trial\.json: field 'meta': must be an object"),
    (lambda r: r["frames"][0][0].pop("category"), r"trial\.json: record frame 0: field 'category'"),
    (lambda r: r["frames"][0][0].update(identity="3"), r"record frame 0: field 'identity'"),
    (lambda r: r["frames"][0][0].update(location="middle"), r"record frame 0: field 'location'.*'middle'"),
    (lambda r: r["frames"].__setitem__(1, "x"), r"record frame 1: field 'frames'"),
    (lambda r: r.update(actions=[None]), r"field 'actions': must hold one answer"),
    (lambda r: r.update(response_type="colour"), r"field 'response_type'"),
    (lambda r: r.pop("answer"), r"field 'answer': missing"),
])
def test_own_layout_wrong_types_are_one_line_errors(tmp_path, edit, match):
    trials = generate_trials("dms_location", 1, 0, STIM)
    write_trials(str(tmp_path), trials, STIM)
    path = tmp_path / trials[0][0] / "trial.json"
    rec = json.loads(path.read_text())
    edit(rec)
    path.write_text(json.dumps(rec))
    with pytest.raises(ReformError, match=match) as e:
        build_dataset("iWISDM", "SingleChoice", {"trial_dir": str(tmp_path)})
    assert "\n" not in str(e.value)


def test_own_layout_index_names_only_trial_folders(tmp_path):
    write_trials(str(tmp_path), generate_trials("dms_location", 1, 0, STIM), STIM)
    (tmp_path / "index.json").write_text(json.dumps({"trials": ["../elsewhere"]}))
    with pytest.raises(ReformError, match=r"index\.json: field 'trials'"):
        read_trials(str(tmp_path))


def test_read_set_vocabulary_covers_every_answer_its_questions_allow(tmp_path):
    """No trial answers with a location, but one question could: the locations are offered."""
    info = {"epochs": 2, "instruction": "observe object 1, observe object 2, if category of object 2 equals "
                                        "category of object 1, then location of object 2? else location of "
                                        "object 1 equals top left?",
            "objects": [_obj(1, 0, 7, 0, 2, space=[0, 0]), _obj(2, 1, 3, 3, 0, space=[1, 0])],
            "answers": ["null", "true"]}
    root = write_fixture(tmp_path / "orig", {"trial_0": FIXTURE["trial_0"], "trial_1": info})
    s, _ = build_dataset("iWISDM", "SingleChoice", {"trial_dir": root}, seed=0, shuffle_options=False)
    assert s[0]["answer_options"] == ["true", "false"]
    assert s[1]["answer_options"] == ["true", "false", "bottom right", "bottom left", "top left", "top right"]
    assert s[1]["answer_options"][s[1]["answer"]] == "true" and s[1]["meta"]["chance"] == 1 / 6
    assert s[1]["meta"]["answer_vocabulary"] == s[1]["answer_options"]


def test_create_bench_folder_names_trial_k_without_underscore(tmp_path):
    """The original's benchmarking/create_bench.py writes trial0, trial1, ..., trial10."""
    infos = {f"trial{k}": FIXTURE["trial_0"] for k in (0, 2, 10)}
    root = write_fixture(tmp_path / "bench", infos)
    _, rows = read_trials(root)
    assert [r[0] for r in rows] == ["trial0", "trial2", "trial10"]
    assert all(r[1].answer == "false" for r in rows)


def test_codes_named_by_the_wrong_stimulus_set_are_caught(tmp_path):
    """Category code 1 was `tables` where the trial was made; here code 1 is `cars`: an error, not a score."""
    ProceduralStimuli(categories=("tables", "cars"), n_identities=2).export(str(tmp_path / "other"), "train")
    info = {"epochs": 2, "instruction": "observe object 1, delay, category of object 1 equals tables?",
            "objects": [_obj(1, 0, 1, 0, 0, space=[0, 0])], "answers": ["null", "true"]}
    root = write_fixture(tmp_path / "orig", {"trial_0": info})
    cfg = {"trial_dir": root, "stim_dir": str(tmp_path / "other")}
    with pytest.raises(ReformError, match=r"orig: record trial_0: field 'answers': 1 of 1 imported trials.*"
                                          r"'false', the file says 'true'.*set stim_dir"):
        build_dataset("iWISDM", "SingleChoice", cfg)
    s, _ = build_dataset("iWISDM", "SingleChoice", dict(cfg, check_answers=False))
    assert s[0]["answer_options"][s[0]["answer"]] == "true"
    # named by the set the trial was made with (code 1 = tables) it reads
    ProceduralStimuli(categories=("cars", "tables"), n_identities=2).export(str(tmp_path / "same"), "train")
    s, _ = build_dataset("iWISDM", "SingleChoice", dict(cfg, stim_dir=str(tmp_path / "same")))
    assert s[0]["answer_options"][s[0]["answer"]] == "true"
