"""Small synthetic prediction records for the report tests (known answers, no model)."""
from __future__ import annotations

from typing import Any, Dict, List

from reform_eval.metrics import evaluate
from reform_eval.utils.seeding import rng_for


def iwisdm_records(n: int = 30, p_correct: float = 0.5, seed: int = 0, dups: int = 1) -> List[Dict[str, Any]]:
    """Trials over three complexities; a response is right with probability ``p_correct``."""
    recs = []
    for i in range(n):
        rtype = ["bool", "location", "bool"][i % 3]
        opts = ["true", "false"] if rtype == "bool" else ["top left", "top right", "bottom left", "bottom right"]
        for d in range(dups):
            right = rng_for(seed, "fixture", i, d).random() < p_correct
            ans = i % len(opts)
            pick = ans if right else (ans + 1) % len(opts)
            recs.append({"sample_id": f"t{i:03d}", "dup_index": d, "benchmark": "iWISDM",
                         "formulation": "SingleChoice", "inference_method": "generation",
                         "instruct": f"Instruction phrasing {d}.", "question": f"Trial {i}: what is it?",
                         "answer_options": opts,
                         "option_marks": "ABCD"[:len(opts)], "answer": ans,
                         "prediction": f"({'ABCD'[pick]})" if i % 7 else "I am not sure",
                         "meta": {"complexity": ["low", "medium", "high"][i % 3],
                                  "feature_group": ["category-only", "mixed"][i % 2], "response_type": rtype,
                                  "n_and": i % 2, "n_or": 0, "n_is_same": i % 3, "n_not_same": 0, "n_switch": 0,
                                  "n_delay": 1 + i % 2, "n_stimuli": 2, "n_distractors": 0,
                                  "chance": 1 / len(opts)}})
    return recs


def mme_records(seed: int = 0, p_correct: float = 0.6, images: int = 6,
                subtasks=("existence", "OCR", "code_reasoning")) -> List[Dict[str, Any]]:
    """``images`` images per subtask, two questions each (Yes then No)."""
    recs = []
    for sub in subtasks:
        for im in range(images):
            for k, gt in enumerate(("Yes", "No")):
                right = rng_for(seed, "mme-fixture", sub, im, k).random() < p_correct
                pred = gt if right else ("No" if gt == "Yes" else "Yes")
                recs.append({"sample_id": f"{sub}/{im:04d}.jpg/{k}", "benchmark": "MME",
                             "formulation": "Generation", "inference_method": "generation",
                             "question": f"Is there a thing {k}? Please answer yes or no.", "answer": gt,
                             "prediction": pred if (im + k) % 5 else "Unsure.", "candidates": ["Yes", "No"],
                             "meta": {"subtask": sub, "image": f"{im:04d}.jpg", "question_index": k}})
    return recs


GOOD = "So sure, I like 7 cats. Some dogs sleep."
BAD = "the end"


def mmmt_if_records(seed: int = 0, chats: int = 5, turns: int = 4, n_resp: int = 2) -> List[Dict[str, Any]]:
    """Chats whose turns carry 1..turns instructions; responses good or bad at random."""
    ids = ["favourite_word_like", "number_odd", "start_char_S", "response_length_short"]
    recs = []
    for c in range(chats):
        for t in range(1, turns + 1):
            rng = rng_for(seed, "pif-fixture", c, t)
            responses = [GOOD if rng.random() < 0.5 else BAD for _ in range(n_resp)]
            recs.append({"sample_id": f"c{c}-t{t:02d}", "benchmark": "MMMT-IF", "formulation": "Generation",
                         "inference_method": "generation", "question": f"Turn {t} question?",
                         "answer": f"Reference {c}-{t}.", "prediction": responses[0], "predictions": responses,
                         "meta": {"chat_id": f"c{c}", "turn": t, "instructions": ids[:t]}})
    return recs


def run(name: str, records: List[Dict[str, Any]], **options: Any) -> Dict[str, Any]:
    """A run dict as compare_runs takes it."""
    form = records[0]["formulation"]
    method = records[0]["inference_method"]
    res = evaluate(records, form, method, **options)
    res.update(formulation=form, infer_method=method, prediction_file=None)
    return {"name": name, "records": records, "result": res}
