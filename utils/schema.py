"""The unified sample: one documented dict shape shared by every benchmark.

Samples stay plain dicts (cheap to pickle across DataLoader workers and to dump as JSON);
this TypedDict is the single place their keys are documented.
"""
from __future__ import annotations

from typing import Any, Dict, List, Literal, TypedDict, Union

from PIL import Image

#: Neutral placeholder for "an image goes here" inside text fields and prompts. Interfaces
#: translate it into their family's own image token. Text without any placeholder gets all
#: images placed before the first user message.
IMAGE_TOKEN = "<image>"

FORMULATIONS = ("SingleChoice", "Generation")
INFER_METHODS = ("generation", "likelihood")
OPTION_MARKS = ("upper", "lower", "number", "random")

ImageLike = Union[Image.Image, str]


class Turn(TypedDict):
    """One message of a conversation history."""

    #: "human" or "assistant"
    # (the key is literally "from"; TypedDict cannot name it, see HISTORY_KEYS)
    value: str


HISTORY_ROLES = ("human", "assistant")


class _SampleRequired(TypedDict):
    sample_id: str            # unique within a build; duplicates share it
    dup_index: int            # 0 .. data_duplication-1
    benchmark: str            # registry name of the builder, e.g. "MME"
    formulation: Literal["SingleChoice", "Generation"]
    inference_method: Literal["generation", "likelihood"]
    images: List[ImageLike]   # order = order of appearance in the prompt
    instruct: str             # the task instruction ('' when none)
    question: str             # the question text (may contain IMAGE_TOKEN)
    answer: Union[int, str]   # SingleChoice: index into answer_options; Generation: reference text
    history: List[Dict[str, str]]  # [{"from": "human"|"assistant", "value": str}, ...]
    meta: Dict[str, Any]      # benchmark-specific fields used by breakdown metrics


class Sample(_SampleRequired, total=False):
    answer_options: List[str]      # SingleChoice: the (possibly shuffled) option texts
    option_marks: List[str]        # SingleChoice: the mark of each option, e.g. ["A", "B"]
    question_with_option: str      # SingleChoice: "... Options: (A) yes; (B) no."
    candidates: List[str]          # likelihood: the texts scored by raw_predict
    answer_index: int              # Generation + likelihood: index of the answer in candidates


#: Keys that hold heavy objects and are dropped from prediction records.
HEAVY_KEYS = ("images",)
