"""iWISDM unit tests: task files, composition, stimuli import, write/read, builder, metric, errors."""
from __future__ import annotations

import csv
import json
import os
import random

import networkx as nx
import numpy as np
import pytest

from reform_eval.build import build_dataset
from reform_eval.build.iwisdm import (AutoTask, InstructionParser, Task, TrialGenerator, ctx_dm, dms, generate_trials,
                          load_task, read_trials, two_back, write_trials)
from reform_eval.build.iwisdm.instructions import InstructionError
from reform_eval.build.iwisdm.operators import CONST, And, GetCategory, GetLocation, IsSame, NotSame, Or, Select, Switch
from reform_eval.build.iwisdm.presets import PRESETS
from reform_eval.build.iwisdm.stimuli import DirectoryStimuli, ProceduralStimuli, procedural_set
from reform_eval.metrics import evaluate
from reform_eval.utils.errors import ReformError
from reform_eval.utils.paths import cache_root
from reform_eval.utils.seeding import rng_for

STIM = procedural_set()
PARSER = InstructionParser(STIM.categories)


# -- task graphs --------------------------------------------------------------------------------
def test_task_json_round_trip_exact_for_every_preset_and_classic_task(tmp_path):
    tasks = [dms("location", 3), ctx_dm("category")] + two_back("category", 5)
    for name, preset in PRESETS.items():
        if preset.space is not None:
            auto = AutoTask(preset.space)
            tasks += [auto.sample(rng_for(0, name, i), name=f"{name}_{i}") for i in range(30)]
    fixed = Task(And(IsSame(GetLocation(Select()), CONST(attr="location", value="bottom left")),
                     NotSame(GetCategory(Select()), CONST(attr="category", value="planes"))), name="consts")
    tasks.append(fixed)
    for t in tasks:
        text = t.to_json()
        back = load_task(text)
        assert back.to_json() == text
        assert load_task(t.to_networkx()).to_json() == text
    path = tmp_path / "task.json"
    fixed.to_json(str(path))
    loaded = load_task(str(path))
    assert loaded.to_json() == fixed.to_json()
    consts = [n for n in loaded.to_dict()["nodes"] if n["op"] == "CONST"]
    assert sorted(c["value"] for c in consts) == ["bottom left", "planes"]
    trial = TrialGenerator(STIM).instantiate(loaded, random.Random(0), n_frames=3)
    assert "location of object" in trial.instruction and "bottom left" in trial.instruction
    assert PARSER.evaluate(trial.instruction, trial.frames)[-1] == trial.answer


def test_task_file_violating_connectivity_names_file_and_field(tmp_path):
    bad = {"nodes": [{"id": 0, "op": "And"}, {"id": 1, "op": "GetCategory"}, {"id": 2, "op": "Select"},
                     {"id": 3, "op": "IsSame"}, {"id": 4, "op": "GetCategory"}, {"id": 5, "op": "Select"},
                     {"id": 6, "op": "GetCategory"}, {"id": 7, "op": "Select"}],
           "edges": [[0, 1], [0, 3], [1, 2], [3, 4], [3, 6], [4, 5], [6, 7]]}
    path = tmp_path / "bad_task.json"
    path.write_text(json.dumps(bad))
    with pytest.raises(ReformError, match=r"bad_task\.json.*node 0.*field 'edges'.*And child 0"):
        load_task(str(path))
    bad2 = {"nodes": [{"id": 0, "op": "Frobnicate"}], "edges": []}
    path.write_text(json.dumps(bad2))
    with pytest.raises(ReformError, match=r"bad_task\.json.*field 'op'.*Frobnicate"):
        load_task(str(path))
    mixed = {"nodes": [{"id": 0, "op": "IsSame"}, {"id": 1, "op": "GetCategory"}, {"id": 2, "op": "Select"},
                       {"id": 3, "op": "GetLocation"}, {"id": 4, "op": "Select"}],
             "edges": [[0, 1], [0, 3], [1, 2], [3, 4]]}
    with pytest.raises(ReformError, match="compares category with location"):
        load_task(mixed, where="mixed.json")


def test_user_networkx_graph_with_shared_select():
    g = nx.DiGraph(n_frames=3)
    g.add_node("root", op="Or")
    g.add_node("c1", op="IsSame")
    g.add_node("c2", op="NotSame")
    for k, op in (("g1", "GetCategory"), ("g2", "GetCategory"), ("g3", "GetLocation"), ("g4", "GetLocation")):
        g.add_node(k, op=op)
    g.add_node("s0", op="Select", when=0)
    g.add_node("s2", op="Select", when=2)
    for p, c, slot in (("root", "c1", 0), ("root", "c2", 1), ("c1", "g1", 0), ("c1", "g2", 1), ("c2", "g3", 0),
                       ("c2", "g4", 1), ("g1", "s0", 0), ("g2", "s2", 0), ("g3", "s0", 0), ("g4", "s2", 0)):
        g.add_edge(p, c, slot=slot)
    task = load_task(g)
    gen = TrialGenerator(STIM)
    for i in range(200):
        tr = gen.instantiate(task, random.Random(i))
        assert tr.instruction.startswith("observe object 1, delay, observe object 2, ")
        assert "category of object 1 equals category of object 2" in tr.instruction
        assert PARSER.evaluate(tr.instruction, tr.frames)[-1] == tr.answer


# -- instructions ------------------------------------------------------------------------------
def test_nested_logic_is_parenthesised_and_parsed():
    s = [Select() for _ in range(6)]
    inner = And(IsSame(GetLocation(s[0]), GetLocation(s[1])), Or(IsSame(GetCategory(s[2]), GetCategory(s[3])),
                                                                  NotSame(GetLocation(s[4]), GetLocation(s[5]))))
    task = Task(Switch(inner, GetLocation(Select()), Switch(IsSame(GetCategory(Select()), CONST(attr="category")),
                                                              GetCategory(Select()), IsSame(GetCategory(Select()), GetCategory(Select())))))
    gen = TrialGenerator(STIM)
    for i in range(300):
        tr = gen.instantiate(task, random.Random(i), n_frames=12)
        assert " and (" in tr.instruction and "? else (if " in tr.instruction
        assert PARSER.evaluate(tr.instruction, tr.frames)[-1] == tr.answer
    with pytest.raises(InstructionError, match="parse error"):
        PARSER.evaluate("observe object 1, location of object 1 equals sideways?", tr.frames[:1])


def test_composition_queue_overlap_interleave_and_two_back():
    gen = TrialGenerator(STIM)
    many = [dms("category", 0) for _ in range(6)]
    for mode, tasks, n_frames in (("queue", many, 12), ("overlap", [dms("location", 1), dms("category", 1)], 5),
                                  ("interleave", [dms("location", 1), dms("category", 1)], 6),
                                  ("timeline", two_back("category", 6), 6)):
        for i in range(100):
            tr = gen.compose(tasks, random.Random(i), mode=mode)
            assert len(tr.frames) == n_frames
            answers = PARSER.evaluate(tr.instruction, tr.frames)
            assert answers == [a for a in tr.actions if a is not None], (mode, tr.instruction)
    # objects beyond 10 are numbered correctly (queue of six DMS tasks: 12 objects)
    tr = gen.compose(many, random.Random(3), mode="queue")
    assert tr.instruction.count("observe object") == 12
    assert "category of object 11 equals category of object 12?" in tr.instruction


def test_distractors_and_fixation():
    gen = TrialGenerator(STIM)
    auto = AutoTask(PRESETS["medium"].space)
    n_dis = 0
    for i in range(300):
        task = auto.sample(random.Random(i))
        tr = gen.instantiate(task, random.Random(i), n_frames=8, n_distractors=2, fixation=True)
        n_dis += tr.meta["n_distractors"]
        for frame in tr.frames:
            assert len({o["location"] for o in frame}) == len(frame)
        assert PARSER.evaluate(tr.instruction, tr.frames)[-1] == tr.answer
    assert n_dis > 300
    im = tr.render(STIM)[0]
    assert im.size == (224, 224) and im.getpixel((112, 112)) == (255, 255, 255)


# -- stimuli -----------------------------------------------------------------------------------
def test_procedural_stimuli_are_distinct_and_deterministic():
    a = np.asarray(STIM.stimulus("cars", 0, 0))
    assert a.shape == (112, 112, 3) and a.any()
    assert np.array_equal(a, np.asarray(ProceduralStimuli().stimulus("cars", 0, 0)))
    imgs = {(c, i, v): np.asarray(STIM.stimulus(c, i, v)).tobytes()
            for c in STIM.categories for i in range(8) for v in range(4)}
    assert len(set(imgs.values())) == len(imgs) == 256


def _small_dir(root, drop_col=None, drop_image=False):
    small = ProceduralStimuli(categories=("cars", "planes", "tables"), n_identities=2)
    split = small.export(str(root), "val")
    if drop_col or drop_image:
        with open(os.path.join(split, "val_metadata.csv")) as f:
            rows = list(csv.DictReader(f))
        cols = [c for c in rows[0] if c != drop_col]
        with open(os.path.join(split, "val_metadata.csv"), "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
            w.writeheader()
            w.writerows(rows)
        if drop_image:
            os.remove(os.path.join(split, "5", "image.png"))
    return split


def test_directory_importer_original_format(tmp_path):
    _small_dir(tmp_path)
    stim = DirectoryStimuli(str(tmp_path))
    assert stim.categories == ("cars", "planes", "tables") and stim.n_identities == 2 and stim.n_views == 4
    trials = generate_trials("high", 50, 0, stim)
    parser = InstructionParser(stim.categories)
    for _, _, tr in trials:
        assert parser.evaluate(tr.instruction, tr.frames)[-1] == tr.answer
        assert all(o["category"] in stim.categories for f in tr.frames for o in f)
    assert tr.render(stim)[-1].size == (224, 224)


def test_directory_importer_errors(tmp_path):
    _small_dir(tmp_path / "a", drop_col="obj_mod")
    with pytest.raises(ReformError, match=r"val_metadata\.csv.*field 'obj_mod'"):
        DirectoryStimuli(str(tmp_path / "a"))
    _small_dir(tmp_path / "b", drop_image=True)
    with pytest.raises(ReformError, match=r"val_metadata\.csv.*record 5.*image missing"):
        DirectoryStimuli(str(tmp_path / "b"))
    with pytest.raises(ReformError, match="stim_dir"):
        DirectoryStimuli(str(tmp_path / "nowhere"))


def test_export_writes_original_layout_and_round_trips(tmp_path):
    small = ProceduralStimuli(categories=("cars", "planes"), n_identities=2)
    split = small.export(str(tmp_path), "train")
    assert split == os.path.join(str(tmp_path), "train")
    # the original pairs a split folder with the metadata file whose name contains the split
    assert sorted(f for f in os.listdir(split) if f.endswith(".csv")) == ["train_metadata.csv"]
    with open(os.path.join(split, "train_metadata.csv")) as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["ref", "ctg_mod", "obj_mod", "ang_mod", "ctg"]
    assert len(rows) == 2 * 2 * small.n_views
    grid = {(int(r["ctg_mod"]), int(r["obj_mod"]), int(r["ang_mod"])) for r in rows}
    assert grid == {(c, o, a) for c in range(2) for o in range(2) for a in range(small.n_views)}
    assert {(r["ctg_mod"], r["ctg"]) for r in rows} == {("0", "cars"), ("1", "planes")}
    for r in rows:
        assert os.path.isfile(os.path.join(split, r["ref"], "image.png"))
    back = DirectoryStimuli(str(tmp_path))
    assert back.categories == small.categories and back.n_views == small.n_views
    for cat in small.categories:
        for i in range(2):
            for v in range(small.n_views):
                assert np.array_equal(np.asarray(back.stimulus(cat, i, v).convert("RGB")),
                                      np.asarray(small.stimulus(cat, i, v).convert("RGB")))
    with pytest.raises(ValueError, match="split"):
        small.export(str(tmp_path), "training")


#: the venv bench/iwisdm_gen.py creates (or one named by IWISDM_ORIG_PYTHON)
ORIG_PYTHON = os.environ.get("IWISDM_ORIG_PYTHON") or os.path.join(cache_root(), "iwisdm_orig_venv", "bin", "python")


@pytest.mark.skipif(not os.path.exists(ORIG_PYTHON), reason="no venv with the original iwisdm==0.1.3")
def test_export_loads_in_original_package(tmp_path):
    """The exported set drives the original package (run in its own venv) end to end."""
    import subprocess
    procedural_set().export(str(tmp_path / "stim"), "train")
    code = ("import sys, iwisdm; env = iwisdm.make(env_id='ShapeNet', dataset_fp=sys.argv[1]); "
            "print(sorted(env.stim_data.attr_with_mapping['category'].values())); "
            "_, (_, t) = env.generate_tasks(1)[0]; imgs, _, info = env.generate_trials(tasks=[t], mode='train')[0]; "
            "print(len(imgs), imgs[0].shape, bool(imgs[0].any()))")
    res = subprocess.run([ORIG_PYTHON, "-I", "-c", code, str(tmp_path / "stim")], capture_output=True, text=True,
                         timeout=300, cwd=str(tmp_path))
    if "No module named 'iwisdm'" in res.stderr:
        pytest.skip(f"{ORIG_PYTHON} has no iwisdm")
    assert res.returncode == 0, res.stderr[-2000:]
    cats, shape = res.stdout.splitlines()
    assert cats == str(sorted(STIM.categories))
    assert shape.split(" ", 1)[1] == "(224, 224, 3) True"


# -- builder, write/read, metric -----------------------------------------------------------------
def test_unknown_preset_names_config_and_field(tmp_path):
    cfg = tmp_path / "iwisdm_bad.yaml"
    cfg.write_text("preset: extreme\nn_trials: 3\n")
    with pytest.raises(ReformError, match=r"iwisdm_bad\.yaml.*field 'preset'.*extreme.*valid names"):
        build_dataset("iWISDM", "Generation", str(cfg))


def test_write_trials_read_back_gives_identical_samples(tmp_path):
    opts = dict(preset="high", n_trials=12, seed=5, n_distractors=1)
    trials = generate_trials("high", 12, 5, STIM, n_distractors=1)
    write_trials(str(tmp_path), trials, STIM, info={"preset": "high"})
    index, back = read_trials(str(tmp_path))
    assert [b[0] for b in back] == [t[0] for t in trials]
    for form, method in (("Generation", "generation"), ("SingleChoice", "likelihood")):
        mem, _ = build_dataset("iWISDM", form, dict(opts), inference_method=method, seed=1)
        disk, _ = build_dataset("iWISDM", form, {"trial_dir": str(tmp_path)}, inference_method=method, seed=1)
        assert len(mem) == len(disk) == 12
        for a, b in zip(mem, disk):
            ia, ib = a.pop("images"), b.pop("images")
            assert a == b
            assert len(ia) == len(ib)
            from reform_eval.utils.images import open_image
            for x, y in zip(ia, ib):
                assert np.array_equal(np.asarray(x), np.asarray(open_image(y)))


def test_builder_formulations_and_prompt():
    s, _ = build_dataset("iWISDM", "Generation", "configs/datasets/iwisdm_low.yaml", n_trials=4, n_examples=2)
    x = s[0]
    assert "respond EXACTLY and ONLY with one of the following answers: true, false)" in x["question"]
    assert x["question"].count("<image>") == len(x["images"]) == 6 + 1 + 3
    assert x["candidates"] == ["true", "false"] and x["answer"] in ("true", "false")
    s2, _ = build_dataset("iWISDM", "Generation", "configs/datasets/iwisdm_low.yaml", n_trials=4, n_examples=2)
    assert [y["question"] for y in s2] == [y["question"] for y in s]
    s, _ = build_dataset("iWISDM", "SingleChoice", "configs/datasets/iwisdm_high.yaml", n_trials=4, options="all")
    assert len(s[0]["answer_options"]) == 14 and "Options: (A)" in s[0]["question_with_option"]
    s, _ = build_dataset("iWISDM", "Generation", "configs/datasets/iwisdm_dms_location_delays.yaml", n_trials=60)
    assert {y["meta"]["n_delay"] for y in s} == {0, 1, 2, 3, 4, 5}


def test_metric_breakdowns_with_chance():
    s, _ = build_dataset("iWISDM", "Generation", "configs/datasets/iwisdm_high.yaml", n_trials=60)
    recs = [{k: v for k, v in x.items() if k != "images"} for x in s]
    for r in recs:
        r["prediction"] = r["answer"].upper() + "."
    res = evaluate(recs, "Generation", "generation")
    assert res["metric"] == "iwisdm" and res["metrics"]["accuracy"] == 1.0
    by = res["metrics"]["by"]
    assert set(by["response_type"]) == {"bool", "location", "category"}
    for rt in ("location", "category"):  # per-sample chance: 1 / the answers the question allows
        grp = [1 / len(r["meta"]["applicable_answers"]) for r in recs if r["meta"]["response_type"] == rt]
        assert by["response_type"][rt]["chance"] == pytest.approx(sum(grp) / len(grp))
    assert set(by) >= {"complexity", "features", "n_and", "n_or", "n_switch", "n_delay", "n_stimuli"}
    assert "iWISDM accuracy by n_delay" in res["tables"]
    for r in recs:
        r["prediction"] = "true"
    res = evaluate(recs, "Generation", "generation")
    n_true = sum(r["answer"] == "true" for r in recs)
    assert res["metrics"]["accuracy"] == pytest.approx(n_true / len(recs))
    sc, _ = build_dataset("iWISDM", "SingleChoice", "configs/datasets/iwisdm_low.yaml", n_trials=20,
                          inference_method="likelihood")
    recs = [{k: v for k, v in x.items() if k != "images"} for x in sc]
    for r in recs:
        r["prediction"] = r["answer"]
    assert evaluate(recs, "SingleChoice", "likelihood")["metrics"]["accuracy"] == 1.0
