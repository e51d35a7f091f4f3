"""MMMT-IF builder: injection statistics, MMDU round trips, the release CSV, bad input."""
from __future__ import annotations

import csv
import json
import os
from collections import Counter
from pathlib import Path
from typing import Any, Dict, List

import pytest
from PIL import Image

from reform_eval.build import build_dataset, load_reform_dataset
from reform_eval.build.mmmt_if import (COL_ALL, COL_CHAT, COL_COUNT, COL_PROMPT, COL_TURN, RELEASE_ADD_COUNTS,
                           add_probability, inject_instructions, load_release, release_statistics)
from reform_eval.metrics.pif import CATEGORY_OF, INSTRUCTION_TEXTS, split_instruction_list
from reform_eval.utils.errors import ReformError

RELEASE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs", "data",
                       "mmmt_if_release.csv")


# ---- injection ------------------------------------------------------------------------------------

def test_injection_statistics() -> None:
    """paper_formula: probability 1 - k/6 per turn, categories never repeat, at most 6, uniform categories."""
    tried = Counter()
    added = Counter()
    first_cat = Counter()
    n_chats = 3000
    for c in range(n_chats):
        plan = inject_instructions(20, seed=7, chat_key=f"chat{c}", rule="paper_formula")
        given: List[str] = []
        for new in plan:
            tried[len(given)] += 1
            if new is not None:
                added[len(given)] += 1
                assert CATEGORY_OF[new] not in {CATEGORY_OF[g] for g in given}
                given.append(new)
        assert 1 <= len(given) <= 6 and plan[0] is not None
        first_cat[CATEGORY_OF[plan[0]]] += 1
    assert added[0] == tried[0] == n_chats  # probability 1 at k = 0
    for k in range(1, 6):
        p = 1 - k / 6
        n = tried[k]
        sd = (p * (1 - p) / n) ** 0.5
        assert abs(added[k] / n - p) < 4 * sd, (k, added[k] / n, p)
    assert added[6] == 0
    for cat, cnt in first_cat.items():
        assert abs(cnt / n_chats - 1 / 6) < 4 * (1 / 6 * 5 / 6 / n_chats) ** 0.5, cat
    # within a category, instructions are chosen uniformly: 'favourite_word' has 3 options
    words = Counter(i for c in range(n_chats) for i in inject_instructions(20, 7, f"chat{c}", rule="paper_formula")
                    if i and i.startswith("favourite_word"))
    total = sum(words.values())
    assert all(abs(v / total - 1 / 3) < 0.05 for v in words.values())


def test_release_add_probabilities_are_the_csv_estimate() -> None:
    """RELEASE_ADD_COUNTS: (turns with k given where one was added, turns with k given)."""
    data = load_release(RELEASE)
    added, tried = Counter(), Counter()
    for rts in data.chats.values():
        k = 0
        for rt in rts:
            if k < 6:
                tried[k] += 1
                added[k] += len(rt.instructions) > k
            k = len(rt.instructions)
    assert {k: (added[k], tried[k]) for k in range(6)} == RELEASE_ADD_COUNTS
    assert [round(add_probability(k), 2) for k in range(7)] == [0.9, 0.78, 0.72, 0.81, 0.7, 0.45, 0.0]
    assert [add_probability(k, "paper_formula") for k in (0, 3, 6)] == [1.0, 0.5, 0.0]
    with pytest.raises(ReformError, match="unknown injection rule"):
        inject_instructions(3, 0, "x", rule="uniform")


def _count_distribution(lengths: List[int], rule: str, seeds: range) -> Dict[int, float]:
    hist: Counter = Counter()
    for seed in seeds:
        for c, n in enumerate(lengths):
            k = 0
            for new in inject_instructions(n, seed, f"chat{c}", rule=rule):
                k += new is not None
                hist[k] += 1
    total = sum(hist.values())
    return {k: v / total for k, v in hist.items()}


def _tv(p: Dict[int, float], q: Dict[int, float]) -> float:
    return 0.5 * sum(abs(p.get(k, 0.0) - q.get(k, 0.0)) for k in set(p) | set(q))


def test_release_injection_reproduces_the_release_counts() -> None:
    """Over the release's 71 chat lengths, instruction counts per turn within TV 0.05 of the release."""
    data = load_release(RELEASE)
    lengths = [len(rts) for rts in data.chats.values()]
    hist = Counter(len(t.instructions) for t in data.turns)
    release = {k: v / len(data.turns) for k, v in hist.items()}
    assert hist[6] == 464 and len(data.turns) == 990
    ours = _count_distribution(lengths, "release", range(20))
    paper = _count_distribution(lengths, "paper_formula", range(20))
    assert _tv(ours, release) <= 0.05, _tv(ours, release)
    assert _tv(paper, release) > 0.2  # the stated formula does not reproduce the release
    assert 0.2 < paper[6] < 0.25 and 0.44 < ours[6] < 0.50


def test_injection_is_seeded() -> None:
    a = inject_instructions(20, 1, "x")
    assert a == inject_instructions(20, 1, "x")
    assert any(inject_instructions(20, s, "x") != a for s in range(2, 6))


# ---- an MMDU-format fixture -------------------------------------------------------------------

def _png(path: Path, colour: tuple) -> None:
    Image.new("RGB", (4, 4), colour).save(path)


def _chat(cid: str, images: List[str], questions: List[str]) -> Dict[str, Any]:
    convs = []
    for i, q in enumerate(questions):
        convs += [{"from": "user", "value": q}, {"from": "assistant", "value": f"Answer {cid} {i + 1}."}]
    return {"id": cid, "image": images, "conversations": convs}


@pytest.fixture()
def mmdu(tmp_path: Path) -> Dict[str, Any]:
    img = tmp_path / "images"
    img.mkdir()
    for i in range(8):
        _png(img / f"im{i}.png", (i * 30, 0, 0))
    (img / "broken.png").write_bytes(b"not an image")
    chats = [
        _chat("c1", ["im0.png", "im1.png", "im2.png"],
              ["Image1: <ImageHere>. Image2: <ImageHere>. What is in the  Image1?",
               "Compare the Image1 and\nImage2.",
               "Image3: <ImageHere>. What colour is the Image3?"]),
        _chat("c6", [f"im{i}.png" for i in range(6)],
              ["".join(f"Image{i + 1}: <ImageHere>. " for i in range(6)) + "Describe them."]),
        _chat("cbad", ["im0.png", "broken.png"], ["Image1: <ImageHere>. Image2: <ImageHere>. Hi?"]),
        _chat("c25", ["im3.png", "im4.png"],
              ["Image1: <ImageHere>. Question 1?"] + [f"Question {i}?" for i in range(2, 25)]
              + ["Image2: <ImageHere>. Question 25?"]),
    ]
    bench = tmp_path / "benchmark.json"
    bench.write_text(json.dumps(chats), encoding="utf-8")
    return {"mmdu_json": str(bench), "image_folder": str(img), "chats": chats, "root": tmp_path}


def _build(cfg: Dict[str, Any], seed: int = 0, **kw: Any) -> tuple:
    cfg = {k: v for k, v in cfg.items() if k not in ("chats", "root")}
    return build_dataset("MMMT-IF", "Generation", cfg, in_context_sample=False, seed=seed, **kw)


def test_mmdu_round_trip(mmdu: Dict[str, Any]) -> None:
    samples, builder = _build(dict(mmdu, images="turn"))
    by_chat = Counter(s["meta"]["chat_id"] for s in samples)
    assert by_chat == {"c1": 3, "c25": 20}  # 6 images and an unreadable image drop chats
    assert builder.skipped == {"too_many_images": 1, "corrupted_images": 1}
    assert any("truncated from 25 to 20" in line for line in builder.build_log)
    c1 = [s for s in samples if s["meta"]["chat_id"] == "c1"]
    assert [s["sample_id"] for s in c1] == ["c1-t01", "c1-t02", "c1-t03"]
    assert [len(s["images"]) for s in c1] == [2, 2, 3]
    assert os.path.basename(c1[2]["images"][2]) == "im2.png"
    expected = inject_instructions(3, 0, "c1")
    for t, s in enumerate(c1):
        new = expected[t]
        assert s["meta"]["new_instruction"] == new
        assert s["meta"]["instructions"] == [i for i in expected[:t + 1] if i]
        prefix = f"Instruction: {INSTRUCTION_TEXTS[new]} " if new else ""
        assert s["question"].startswith(prefix)
        assert "<ImageHere>" not in s["question"]
        assert s["answer"] == f"Answer c1 {t + 1}."
        assert s["instruct"] == "" and s["benchmark"] == "MMMT-IF"
        assert len(s["history"]) == 2 * t
        assert builder.group_key(s) == "c1"
    assert c1[0]["question"].endswith("Image1: <image>. Image2: <image>. What is in the  Image1?")
    h = c1[2]["history"]
    assert [x["from"] for x in h] == ["human", "assistant", "human", "assistant"]
    assert h[1] == {"from": "assistant", "value": "Answer c1 1.", "source_sample_id": "c1-t01"}
    assert h[0]["value"] == c1[0]["question"] and h[2]["value"] == c1[1]["question"]
    # every image placeholder in the context has an image, in order
    tokens = sum(x["value"].count("<image>") for x in h) + c1[2]["question"].count("<image>")
    assert tokens == len(c1[2]["images"]) == 3
    c25 = [s for s in samples if s["meta"]["chat_id"] == "c25"]
    assert c25[-1]["meta"]["turn"] == 20 and len(c25[-1]["images"]) == 1
    # same seed: identical build; another seed: different instructions somewhere
    again, _ = _build(dict(mmdu, images="turn"))
    assert again == samples
    other, _ = _build(dict(mmdu, images="turn"), seed=3)
    assert [s["meta"]["instructions"] for s in other] != [s["meta"]["instructions"] for s in samples]


def test_images_at_start_of_chat(mmdu: Dict[str, Any]) -> None:
    """Default images: start (paper Section 4.2): every image of the chat comes with turn 1."""
    samples, builder = _build(mmdu)
    per_turn, _ = _build(dict(mmdu, images="turn"))
    c1 = [s for s in samples if s["meta"]["chat_id"] == "c1"]
    assert [len(s["images"]) for s in c1] == [3, 3, 3]
    assert [os.path.basename(p) for p in c1[0]["images"]] == ["im0.png", "im1.png", "im2.png"]
    assert c1[0]["question"].endswith("Image1: <image>. Image2: <image>. Image3: <image>.\nWhat is in the  Image1?")
    assert c1[2]["question"].endswith("What colour is the Image3?") and "<image>" not in c1[2]["question"]
    h = c1[2]["history"]
    assert sum(x["value"].count("<image>") for x in h) + c1[2]["question"].count("<image>") == 3
    assert all(s["meta"]["images_at"] == "start" for s in samples)
    # same instructions and answers as the per-turn placement, only the images move
    assert [s["meta"]["instructions"] for s in samples] == [s["meta"]["instructions"] for s in per_turn]
    c25 = [s for s in samples if s["meta"]["chat_id"] == "c25"]
    assert len(c25[0]["images"]) == 1  # the image introduced after the 20-turn cut stays out
    with pytest.raises(ReformError, match="field 'images': must be one of start, turn, got 'middle'"):
        _build(dict(mmdu, images="middle"))
    with pytest.raises(ReformError, match="field 'injection': must be one of release, paper_formula, got 'x'"):
        _build(dict(mmdu, injection="x"))


def test_mmdu_dict_format_and_dataset(mmdu: Dict[str, Any], tmp_path: Path) -> None:
    as_dict = {c["id"]: {k: v for k, v in c.items() if k != "id"} for c in mmdu["chats"][:1]}
    p = tmp_path / "dict.json"
    p.write_text(json.dumps(as_dict), encoding="utf-8")
    cfg = dict(mmdu, mmdu_json=str(p))
    ds = load_reform_dataset("MMMT-IF", "Generation", {k: v for k, v in cfg.items() if k not in ("chats", "root")},
                             in_context_sample=False)
    assert len(ds) == 3
    assert all(isinstance(im, Image.Image) for im in ds[2]["images"]) and len(ds[2]["images"]) == 3


def test_instructions_at_end(mmdu: Dict[str, Any]) -> None:
    plain, _ = _build(mmdu)
    ablate, _ = _build(mmdu, instructions_at_end=True)
    for a, b in zip(plain, ablate):
        ids = b["meta"]["instructions"]
        tail = " ".join(f"Instruction: {INSTRUCTION_TEXTS[i]}" for i in ids)
        assert b["question"] == (a["question"].rstrip() + "\n" + tail if ids else a["question"])
        assert b["history"] == a["history"] and b["meta"]["instructions_at_end"] is True


def test_yaml_config(mmdu: Dict[str, Any], tmp_path: Path) -> None:
    cfg = tmp_path / "cfg" / "mmmt_if.yaml"
    cfg.parent.mkdir()
    cfg.write_text("source: mmdu\nmmdu_json: ../benchmark.json\nimage_folder: ../images\nnum_chats: 1\n")
    samples, _ = build_dataset("MMMT-IF", "Generation", str(cfg), in_context_sample=False)
    assert {s["meta"]["chat_id"] for s in samples} == {"c1"}


# ---- bad input --------------------------------------------------------------------------------

def _write_chats(mmdu: Dict[str, Any], chats: List[Dict[str, Any]]) -> Dict[str, Any]:
    p = mmdu["root"] / "bad.json"
    p.write_text(json.dumps(chats), encoding="utf-8")
    return dict(mmdu, mmdu_json=str(p))


def test_bad_mmdu_input(mmdu: Dict[str, Any]) -> None:
    mismatch = _chat("cm", ["im0.png"], ["Image1: <ImageHere>. Hi?", "Image2: <ImageHere>. And this?"])
    with pytest.raises(ReformError, match=r"chat cm turn 2: 2 <ImageHere> tokens so far but only 1 images"):
        _build(_write_chats(mmdu, [mismatch]))
    escape = _chat("ce", ["../benchmark.json"], ["Image1: <ImageHere>. Hi?"])
    with pytest.raises(ReformError, match=r"chat ce turn 1: image path '../benchmark.json' escapes"):
        _build(_write_chats(mmdu, [escape]))
    samples, builder = _build(_write_chats(mmdu, [mismatch, escape, mmdu["chats"][0]]), skip_bad_chats=True)
    assert len(samples) == 3 and builder.skipped == {"bad_chat": 2}
    role = {"id": "cr", "image": [], "conversations": [{"from": "robot", "value": "x"}]}
    with pytest.raises(ReformError, match="chat cr turn 1: message 0 has unknown role"):
        _build(_write_chats(mmdu, [role]))
    with pytest.raises(ReformError, match="needs option 'mmdu_json'"):
        build_dataset("MMMT-IF", "Generation", {"image_folder": "x"})
    with pytest.raises(ReformError, match="MMDU benchmark file not found"):
        _build(dict(mmdu, mmdu_json=str(mmdu["root"] / "missing.json")))


# ---- release CSV --------------------------------------------------------------------------------

def test_release_csv_counts_and_cumulative_lists() -> None:
    data = load_release(RELEASE)
    assert len(data.turns) == 990 and len(data.chats) == 71
    stats = release_statistics(data)
    assert stats["max_turns_per_chat"] == 20
    assert stats["reported_pif_Gemini"] == pytest.approx(0.473, abs=5e-4)
    assert stats["reported_pif_GPT-4o"] == pytest.approx(0.648, abs=5e-4)
    assert stats["reported_pif_Sonnet"] == pytest.approx(0.771, abs=5e-4)
    assert stats["instruction_count_histogram"] == {0: 8, 1: 91, 2: 97, 3: 85, 4: 99, 5: 146, 6: 464}
    well_formed = [t for t in data.turns if t.listed is not None]
    assert len(well_formed) == 989
    assert all(t.instructions == t.listed for t in well_formed)
    assert all(t.instruction_count == len(t.instructions) for t in data.turns)
    for rts in data.chats.values():  # categories never repeat, at most 6
        final = rts[-1].instructions
        assert len(final) <= 6 and len({CATEGORY_OF[i] for i in final}) == len(final)
    irr = "\n".join(data.irregularities)
    for needle in ("chat 32: no turn 10", "chat 43: no turn 13", "chat 86: no turn 9",
                   "chat 93 turn 5: 'all instructions' holds no instruction list",
                   "8 turns with instruction count 0"):
        assert needle in irr
    assert len(data.irregularities) == 5
    # the release's wording differs from the paper's and is kept as released
    assert data.texts["end_char_exclamation"] == "End every sentence with a exclamation mark (!)."


def test_release_only_builder() -> None:
    samples, builder = _build({"source": "release_only", "release_csv": RELEASE})
    assert len(samples) == 990 and len({builder.group_key(s) for s in samples}) == 71
    c93 = [s for s in samples if s["meta"]["chat_id"] == "93"]
    assert len(c93[4]["meta"]["instructions"]) == 5  # from the prompts, not the broken column
    c32 = [s["meta"]["turn"] for s in samples if s["meta"]["chat_id"] == "32"]
    assert 10 not in c32 and len(c32) == 19
    s = samples[3]
    assert s["sample_id"] == "0-t04" and s["images"] == [] and s["answer"] == ""
    assert s["question"].startswith("Instruction: Use the word 'per se' at least once in all future responses. How")
    assert s["meta"]["instructions"] == ["number_odd", "favourite_word_per_se"]
    assert [h.get("source_sample_id") for h in s["history"][1::2]] == ["0-t01", "0-t02", "0-t03"]
    assert any("release irregularity: chat 86: no turn 9" in line for line in builder.build_log)


def _write_release(path: Path, rows: List[Dict[str, Any]]) -> str:
    cols = [COL_CHAT, COL_TURN, COL_PROMPT, COL_ALL, COL_COUNT]
    with open(path, "w", encoding="utf-8", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        for r in rows:
            w.writerow(r)
    return str(path)


def _row(cid: int, turn: int, prompt: str, listed: str, count: int) -> Dict[str, Any]:
    return {COL_CHAT: cid, COL_TURN: turn, COL_PROMPT: prompt, COL_ALL: listed, COL_COUNT: count}


S = "Instruction: Start every sentence with \nthe letter (S)."
Q = "Instruction: End every sentence with a \nquestion mark (?)."


def test_release_matched_to_mmdu(mmdu: Dict[str, Any]) -> None:
    rows = [_row(7, 1, S + " What is in the \nImage1?", S, 1),
            _row(7, 3, Q + " What colour is the Image3?", S + " " + Q, 2)]  # turn 2 left out
    csv_path = _write_release(mmdu["root"] / "release.csv", rows)
    samples, builder = _build(dict(mmdu, release_csv=csv_path, images="turn"))
    assert [s["sample_id"] for s in samples] == ["7-t01", "7-t03"]
    t3 = samples[1]
    assert t3["meta"]["mmdu_id"] == "c1" and t3["meta"]["mmdu_turn"] == 3
    assert t3["meta"]["instructions"] == ["start_char_S", "end_char_question"]
    assert t3["question"] == ("Instruction: End every sentence with a question mark (?). "
                              "Image3: <image>. What colour is the Image3?")
    assert len(t3["images"]) == 3 and t3["answer"] == "Answer c1 3."
    assert t3["history"][1]["source_sample_id"] == "7-t01"
    assert any("chat 7: no turn 2" in line for line in builder.build_log)
    at_start, _ = _build(dict(mmdu, release_csv=csv_path))
    assert at_start[0]["question"] == ("Instruction: Start every sentence with the letter (S). Image1: <image>. "
                                       "Image2: <image>. Image3: <image>.\nWhat is in the  Image1?")
    assert at_start[1]["question"].endswith("(?). What colour is the Image3?")
    assert [len(s["images"]) for s in at_start] == [3, 3]


def test_release_bad_input(mmdu: Dict[str, Any]) -> None:
    root = mmdu["root"]
    unmatched = _write_release(root / "u.csv", [_row(7, 1, S + " What is in the Image1?", S, 1),
                                                _row(7, 2, "A question nobody asked?", S, 1)])
    with pytest.raises(ReformError, match=r"chat 7 turn 2: question 'A question nobody asked\?' not found"):
        _build(dict(mmdu, release_csv=unmatched))
    samples, builder = _build(dict(mmdu, release_csv=unmatched), skip_unmatched=True)
    assert len(samples) == 1 and builder.skipped == {"unmatched_rows": 1}
    unknown = _write_release(root / "k.csv", [_row(4, 2, "Instruction: Reply in French. Hi?", "", 0)])
    with pytest.raises(ReformError, match=r"chat 4 turn 2: unknown MMMT-IF instruction text"):
        load_release(unknown)
    broken = root / "b.csv"
    broken.write_text("conversation id,prompt\n1,hi\n", encoding="utf-8")
    with pytest.raises(ReformError, match="missing columns"):
        load_release(str(broken))


def test_split_instruction_list_on_release_text() -> None:
    assert split_instruction_list(S + " " + Q) == ["start_char_S", "end_char_question"]


def test_release_only_yaml_config() -> None:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    samples, _ = build_dataset("MMMT-IF", "Generation",
                               os.path.join(root, "configs", "datasets", "mmmt_if_release_only.yaml"))
    assert len(samples) == 990
