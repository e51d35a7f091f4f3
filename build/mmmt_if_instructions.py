"""MMMT-IF's instruction set (paper Table 6) and the recognition of instruction texts.

Why here: the 13 instructions are a benchmark constant. The builder injects and reads them
(build/mmmt_if.py), the checkers score them (metrics/pif_checkers.py) and the context policy
keeps them (evaluation/context.py); one definition below all three keeps the layers acyclic.
"""
from __future__ import annotations

import re
from typing import Dict, List, Optional, Tuple

from ..utils.errors import ReformError

#: category -> instruction ids in that category (6 categories, 13 instructions)
CATEGORIES: Dict[str, Tuple[str, ...]] = {
    "response_length": ("response_length_short", "response_length_long"),
    "start_char": ("start_char_S", "start_char_B"),
    "end_char": ("end_char_question", "end_char_exclamation"),
    "favourite_word": ("favourite_word_like", "favourite_word_itself", "favourite_word_per_se"),
    "sentence_length": ("sentence_length_short", "sentence_length_long"),
    "number": ("number_even", "number_odd"),
}
INSTRUCTION_IDS: Tuple[str, ...] = tuple(i for ids in CATEGORIES.values() for i in ids)
CATEGORY_OF: Dict[str, str] = {i: c for c, ids in CATEGORIES.items() for i in ids}

#: the canonical text of each instruction, as written in the paper's Table 6
INSTRUCTION_TEXTS: Dict[str, str] = {
    "response_length_short": "Make all the following responses no more than 4 sentences.",
    "response_length_long": "Make all the following responses at least 5 sentences.",
    "start_char_S": "Start every sentence with the letter (S).",
    "start_char_B": "Start every sentence with the letter (B).",
    "end_char_question": "End every sentence with a question mark (?).",
    "end_char_exclamation": "End every sentence with an exclamation mark (!).",
    "favourite_word_like": "Use the word 'like' at least once in all future responses.",
    "favourite_word_itself": "Use the word 'itself' at least once in all future responses.",
    "favourite_word_per_se": "Use the word 'per se' at least once in all future responses.",
    "sentence_length_short": ("Only use responses to questions where each sentence in the response is "
                              "at most 18 words in all future responses."),
    "sentence_length_long": ("Only use responses to questions where each sentence in the response is "
                             "at least 18 words in all future responses."),
    "number_even": "Include at least one even number bigger than 5 in each of your responses.",
    "number_odd": "Include at least one odd number bigger than 5 in each of your responses.",
}

#: wordings seen elsewhere (release CSV, paper Tables 7-11) that mean the same instruction
_TEXT_VARIANTS: Dict[str, Tuple[str, ...]] = {
    "end_char_exclamation": ("End every sentence with a exclamation mark (!).",),
    "sentence_length_short": ("Only use responses to question where each sentence in the response is "
                              "at most 18 words in all future responses.",),
    "sentence_length_long": ("Only use responses to question where each sentence in the response is "
                             "at least 18 words in all future responses.",),
    "number_even": ("Include at least one even number in the range bigger than 5 in each of your responses.",),
    "number_odd": ("Include at least one odd number in the range bigger than 5 in each of your responses.",),
}

_PREFIX_RE = re.compile(r"^\s*instruction\s*:\s*", re.I)


def _text_key(text: str) -> str:
    """Why: recognition must ignore case, spacing, hard wraps and the 'Instruction:' prefix."""
    text = _PREFIX_RE.sub("", str(text))
    return " ".join(re.sub(r"[^0-9a-z?!' ]+", " ", text.lower().replace("’", "'")).split())


_KEY_TO_ID: Dict[str, str] = {}
for _iid, _txt in INSTRUCTION_TEXTS.items():
    for _t in (_txt,) + _TEXT_VARIANTS.get(_iid, ()):
        _KEY_TO_ID[_text_key(_t)] = _iid
#: longest first, so that a prompt prefix is matched by the fullest wording
_KEYS_BY_LENGTH = sorted(_KEY_TO_ID, key=len, reverse=True)


def instruction_id(text_or_id: str) -> str:
    """The id of an instruction given by id or by any known wording; ReformError otherwise."""
    if text_or_id in CATEGORY_OF:
        return text_or_id
    iid = _KEY_TO_ID.get(_text_key(text_or_id))
    if iid is None:
        raise ReformError(f"unknown MMMT-IF instruction text {str(text_or_id)[:120]!r}")
    return iid


def split_instruction_prefix(prompt: str) -> Tuple[Optional[str], str]:
    """Split ``"Instruction: <text> <question>"`` into (instruction id, question).

    Returns (None, prompt) when the prompt starts with no "Instruction:"; raises ReformError
    when it does but the text is no known instruction. Whitespace in the question is kept.
    """
    m = _PREFIX_RE.match(prompt)
    if not m:
        return None, prompt
    rest = prompt[m.end():]
    # walk word by word until the consumed part is a known instruction text
    for end in re.finditer(r"\S+", rest):
        key = _text_key(rest[:end.end()])
        if key in _KEY_TO_ID:
            return _KEY_TO_ID[key], rest[end.end():].lstrip()
        if len(key) > len(_KEYS_BY_LENGTH[0]):
            break
    raise ReformError(f"unknown MMMT-IF instruction text at the start of {prompt[:160]!r}")


def split_instruction_list(text: str) -> List[str]:
    """Ids of a concatenation ``"Instruction: a. Instruction: b."`` (ReformError if unknown)."""
    parts = [p for p in re.split(r"(?i)(?=instruction\s*:)", str(text)) if p.strip()]
    return [instruction_id(p) for p in parts]
