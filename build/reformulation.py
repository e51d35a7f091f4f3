"""The reformulation helpers, implemented once for every benchmark.

Builders produce *base items* (question, images, answer, options, meta); this module turns
each into ``data_duplication`` unified samples: option shuffling, option marks, the
instruction phrasing, the optional one-shot in-context exchange and likelihood candidates.
All randomness comes from ``rng_for(seed, sample_id, dup_index, purpose)``.
"""
from __future__ import annotations

import copy
import string
from typing import Any, Dict, List, Optional, Sequence

from ..utils.schema import FORMULATIONS, INFER_METHODS, OPTION_MARKS
from ..utils.errors import ReformError, unknown_name
from ..utils.seeding import rng_for

#: Generic instruction pools, keyed by (formulation, inference_method). Builders may supply
#: their own pool; ``random_instruct`` picks one phrasing per duplicate, else the first.
INSTRUCTION_POOLS: Dict[tuple, List[str]] = {
    ("SingleChoice", "generation"): [
        "Take a close look at the image and the question, then choose the correct option and answer with its mark.",
        "Answer the multiple-choice question about the image by giving the mark of the right option.",
        "Select the option that best answers the question about the image. Reply with the option mark.",
        "Read the question and the options, inspect the image, and respond with the mark of the correct option.",
        "Choose the single correct answer from the options below. Give the option mark, like (A).",
        "Look at the image, consider every option, and answer with the mark of the one that is right.",
    ],
    ("SingleChoice", "likelihood"): [
        "Take a close look at the image and answer the question.",
        "Answer the question about the image.",
        "Look at the image and give the answer to the question.",
        "Inspect the image carefully, then answer the question.",
        "Based on the image, what is the answer to the question?",
        "Study the image and reply to the question with the right answer.",
    ],
    ("Generation", "generation"): [
        "Answer the question about the image.",
        "Look at the image and answer the question.",
        "Based on the image, respond to the question.",
        "Examine the image closely and answer the question that follows.",
        "Use the image to answer the question below.",
        "Please look at the image and answer.",
    ],
    ("Generation", "likelihood"): [
        "Answer the question about the image.",
        "Look at the image and answer the question.",
        "Based on the image, respond to the question.",
        "Examine the image closely and answer the question that follows.",
        "Use the image to answer the question below.",
        "Please look at the image and answer.",
    ],
}

#: The text-only one-shot exchange used when a builder has none of its own. It shows the
#: expected answer format without adding images to the prompt.
DEFAULT_IN_CONTEXT: Dict[str, Dict[str, Any]] = {
    "SingleChoice": {"question": "Which of these is a fruit?",
                     "answer_options": ["a hammer", "an apple", "a bicycle"], "answer": 1},
    "Generation": {"question": "What colour is a clear daytime sky?", "answer": "blue"},
}


def option_marks(style: str, n: int) -> List[str]:
    """The marks for ``n`` options in ``style`` (upper: A B C, lower: a b c, number: 1 2 3)."""
    if style == "upper":
        alphabet = string.ascii_uppercase
    elif style == "lower":
        alphabet = string.ascii_lowercase
    elif style == "number":
        return [str(i + 1) for i in range(n)]
    else:
        raise unknown_name("option mark style", style, ("upper", "lower", "number"))
    if n > len(alphabet):
        raise ReformError(f"{n} options exceed the {len(alphabet)} available '{style}' marks")
    return list(alphabet[:n])


def format_options(question: str, options: Sequence[str], marks: Sequence[str]) -> str:
    """The single option formatter: ``"<question> Options: (A) yes; (B) no."``."""
    body = "; ".join(f"({m}) {o}" for m, o in zip(marks, options))
    question = question.rstrip()
    sep = " " if question else ""
    return f"{question}{sep}Options: {body}."


def format_choice_answer(mark: str, option: str) -> str:
    """How an assistant states a chosen option in in-context history: ``(B) an apple``."""
    return f"({mark}) {option}"


class Reformulator:
    """Turns base items into unified samples for one (formulation, method, options) setting."""

    def __init__(self, benchmark: str, formulation: str, inference_method: str = "generation",
                 in_context_sample: bool = True, random_instruct: bool = True,
                 data_duplication: int = 1, shuffle_options: bool = True,
                 option_mark: str = "upper", seed: int = 0,
                 instruction_pool: Optional[List[str]] = None,
                 in_context_example: Optional[Dict[str, Any]] = None) -> None:
        if formulation not in FORMULATIONS:
            raise unknown_name("formulation", formulation, FORMULATIONS)
        if inference_method not in INFER_METHODS:
            raise unknown_name("inference method", inference_method, INFER_METHODS)
        if option_mark not in OPTION_MARKS:
            raise unknown_name("option mark", option_mark, OPTION_MARKS)
        if int(data_duplication) < 1:
            raise ReformError(f"data_duplication must be >= 1, got {data_duplication}")
        self.benchmark = benchmark
        self.formulation = formulation
        self.inference_method = inference_method
        self.in_context_sample = bool(in_context_sample)
        self.random_instruct = bool(random_instruct)
        self.data_duplication = int(data_duplication)
        self.shuffle_options = bool(shuffle_options)
        self.option_mark = option_mark
        self.seed = int(seed)
        self.instruction_pool = list(instruction_pool or INSTRUCTION_POOLS[(formulation, inference_method)])
        self.in_context_example: Dict[str, Any] = in_context_example or DEFAULT_IN_CONTEXT[formulation]

    # -- per-duplicate choices -------------------------------------------------------
    def _mark_style(self, sample_id: str, dup: int) -> str:
        if self.option_mark != "random":
            return self.option_mark
        return rng_for(self.seed, sample_id, dup, "mark").choice(("upper", "lower", "number"))

    def _instruct(self, sample_id: str, dup: int, pool: List[str]) -> str:
        if not pool:
            return ""
        if not self.random_instruct:
            return pool[0]
        return rng_for(self.seed, sample_id, dup, "instruct").choice(pool)

    def _order(self, sample_id: str, dup: int, n: int) -> List[int]:
        order = list(range(n))
        if self.shuffle_options:
            rng_for(self.seed, sample_id, dup, "options").shuffle(order)
        return order

    def _one_shot(self, style: str) -> List[Dict[str, str]]:
        ex = self.in_context_example
        if self.formulation == "SingleChoice":
            marks = option_marks(style, len(ex["answer_options"]))
            question = format_options(ex["question"], ex["answer_options"], marks)
            a = int(ex["answer"])
            reply = format_choice_answer(marks[a], ex["answer_options"][a])
        else:
            question, reply = ex["question"], str(ex["answer"])
        return [{"from": "human", "value": question}, {"from": "assistant", "value": reply}]

    # -- main entry --------------------------------------------------------------------
    def expand(self, item: Dict[str, Any]) -> List[Dict[str, Any]]:
        """All duplicates of one base item, as unified samples."""
        return [self.reformulate(item, dup) for dup in range(self.data_duplication)]

    def reformulate(self, item: Dict[str, Any], dup: int) -> Dict[str, Any]:
        """One unified sample from a base item (the item itself is not modified)."""
        sid = str(item["sample_id"])
        sample: Dict[str, Any] = {
            "sample_id": sid,
            "dup_index": dup,
            "benchmark": self.benchmark,
            "formulation": self.formulation,
            "inference_method": self.inference_method,
            "images": list(item.get("images", [])),
            "question": item.get("question", ""),
            "history": copy.deepcopy(item.get("history", [])),
            "meta": copy.deepcopy(item.get("meta", {})),
        }
        pool = item.get("instruction_pool") or self.instruction_pool
        sample["instruct"] = item["instruct"] if "instruct" in item else self._instruct(sid, dup, pool)
        style = self._mark_style(sid, dup)
        if self.formulation == "SingleChoice":
            options = list(item["answer_options"])
            answer = int(item["answer"])
            if not 0 <= answer < len(options):
                raise ReformError(f"sample {sid}: answer index {answer} out of range for {len(options)} options")
            order = self._order(sid, dup, len(options))
            sample["answer_options"] = [options[i] for i in order]
            sample["answer"] = order.index(answer)
            sample["option_marks"] = option_marks(style, len(options))
            sample["question_with_option"] = format_options(sample["question"], sample["answer_options"],
                                                            sample["option_marks"])
            if self.inference_method == "likelihood":
                sample["candidates"] = list(sample["answer_options"])
        else:
            sample["answer"] = item["answer"]
            if "candidates" in item:
                sample["candidates"] = list(item["candidates"])
                if "answer_index" in item:
                    sample["answer_index"] = int(item["answer_index"])
            elif self.inference_method == "likelihood":
                raise ReformError(f"sample {sid}: the {self.benchmark} builder gives no candidates, "
                                  "so Generation cannot be scored by likelihood")
        if self.in_context_sample:
            sample["history"] = self._one_shot(style) + sample["history"]
        return sample
