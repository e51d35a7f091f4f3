"""The 13 MMMT-IF instruction checkers, on one shared parse of a response, and PIF.

Why a parse object: five checkers read sentences, two read words per sentence and two
read numbers, so the response is split once (lazily) and every checker reads the parts it
needs; checking all 13 instructions costs little more than one. The reading rules live in
metrics/pif_sentences.py and metrics/pif_words.py; docs/mmmt_if.md writes them out.
"""
from __future__ import annotations

import re
import unicodedata
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from ..build.mmmt_if_instructions import INSTRUCTION_IDS, INSTRUCTION_TEXTS, instruction_id
from .pif_sentences import first_alnum, iter_sentences, last_mark
from .pif_words import ITSELF_RE, LIKE_RE, PER_SE_RE, count_words, find_integers, has_dash


class ParsedResponse:
    """One response parsed once; every checker reads the parts it needs (lazily).

    Sentences are produced on demand: a checker that fails on the first sentence, or a
    count that only needs to reach 5, does not split the rest (the loose variants of a
    long degenerate reply stay cheap).
    """

    __slots__ = ("text", "number_words", "_sentences", "_more", "_word_counts", "_ints", "_lower")

    def __init__(self, text: Optional[str], number_words: bool = False) -> None:
        self.text = text if isinstance(text, str) else ""
        self.number_words = number_words
        self._sentences: List[str] = []
        self._more: Optional[Iterator[str]] = iter_sentences(self.text)
        self._word_counts: Optional[List[int]] = None
        self._ints: Optional[List[int]] = None
        self._lower: Optional[str] = None

    @property
    def lower(self) -> str:
        if self._lower is None:
            self._lower = self.text.lower()
        return self._lower

    def iter_sentences(self) -> Iterator[str]:
        """The sentences in order, splitting only as far as the caller reads."""
        yield from self._sentences
        more = self._more
        while more is not None:
            for s in more:
                self._sentences.append(s)
                yield s
            self._more = more = None

    def count_sentences(self, limit: int) -> int:
        """The number of sentences, counted up to ``limit``."""
        n = 0
        for _ in self.iter_sentences():
            n += 1
            if n >= limit:
                break
        return n

    @property
    def sentences(self) -> List[str]:
        if self._more is not None:
            for _ in self.iter_sentences():
                pass
        return self._sentences

    @property
    def word_counts(self) -> List[int]:
        if self._word_counts is None:
            self._word_counts = [count_words(s) for s in self.sentences]
        return self._word_counts

    @property
    def integers(self) -> List[int]:
        if self._ints is None:
            self._ints = find_integers(self.text, self.number_words)
        return self._ints


# ---------------------------------------------------------------------------------------
# The 13 checkers (on a parsed response) and their public string versions
# ---------------------------------------------------------------------------------------

def _response_length_short(p: ParsedResponse) -> bool:
    return 1 <= p.count_sentences(5) <= 4


def _response_length_long(p: ParsedResponse) -> bool:
    return p.count_sentences(5) >= 5


def _every_sentence(ok: Callable[[str], bool]) -> Callable[[ParsedResponse], bool]:
    """A checker: there is a sentence, and ``ok`` holds for each (stops at the first failure)."""
    def check(p: ParsedResponse) -> bool:
        seen = False
        for x in p.iter_sentences():
            if not ok(x):
                return False
            seen = True
        return seen
    return check


def _starts_with(letter: str) -> Callable[[ParsedResponse], bool]:
    return _every_sentence(lambda x: first_alnum(x).lower() == letter)


def _ends_with(mark: str) -> Callable[[ParsedResponse], bool]:
    return _every_sentence(lambda x: last_mark(x) == mark)


def _has(pattern: "re.Pattern[str]") -> Callable[[ParsedResponse], bool]:
    def check(p: ParsedResponse) -> bool:
        return pattern.search(p.lower) is not None
    return check


def _at_most_18(x: str) -> bool:
    # without a dash, whitespace tokens bound the words from above: count only when needed
    return (len(x.split()) <= 18 and not has_dash(x)) or count_words(x) <= 18


def _at_least_18(x: str) -> bool:
    return (len(x.split()) >= 18 or has_dash(x)) and count_words(x) >= 18


_sentence_length_short = _every_sentence(_at_most_18)
_sentence_length_long = _every_sentence(_at_least_18)


def _number_even(p: ParsedResponse) -> bool:
    return any(v > 5 and v % 2 == 0 for v in p.integers)


def _number_odd(p: ParsedResponse) -> bool:
    return any(v > 5 and v % 2 == 1 for v in p.integers)


_PARSED_CHECKERS: Dict[str, Callable[[ParsedResponse], bool]] = {
    "response_length_short": _response_length_short,
    "response_length_long": _response_length_long,
    "start_char_S": _starts_with("s"),
    "start_char_B": _starts_with("b"),
    "end_char_question": _ends_with("?"),
    "end_char_exclamation": _ends_with("!"),
    "favourite_word_like": _has(LIKE_RE),
    "favourite_word_itself": _has(ITSELF_RE),
    "favourite_word_per_se": _has(PER_SE_RE),
    "sentence_length_short": _sentence_length_short,
    "sentence_length_long": _sentence_length_long,
    "number_even": _number_even,
    "number_odd": _number_odd,
}


def _first_failing(values: Sequence[Any], ok: Callable[[Any], bool]) -> Optional[int]:
    for i, v in enumerate(values):
        if not ok(v):
            return i
    return None


def explain_instruction(response: Optional[str], instruction: str, number_words: bool = False) -> str:
    """One line saying why the strict checker accepts or rejects ``response`` (for the report)."""
    text = readable(response) if isinstance(response, str) else ""
    if not text.strip():
        return "empty response"
    return _explain(ParsedResponse(text, number_words), instruction_id(instruction))


def _explain(p: ParsedResponse, iid: str) -> str:
    sents = p.sentences
    n = len(sents)
    if iid.startswith("response_length"):
        return f"{n} sentence{'s' * (n != 1)} (needs {'1-4' if iid.endswith('short') else 'at least 5'})"
    if not sents and (iid.startswith(("start_char", "end_char", "sentence_length"))):
        return "no sentence found"
    if iid.startswith("start_char"):
        letter = iid[-1].lower()
        bad = _first_failing(sents, lambda x: first_alnum(x).lower() == letter)
        if bad is None:
            return f"all {n} sentences start with {letter.upper()}"
        return f"sentence {bad + 1} of {n} starts with {first_alnum(sents[bad])!r}"
    if iid.startswith("end_char"):
        mark = "?" if iid.endswith("question") else "!"
        bad = _first_failing(sents, lambda x: last_mark(x) == mark)
        if bad is None:
            return f"all {n} sentences end with {mark}"
        return f"sentence {bad + 1} of {n} ends with {last_mark(sents[bad])!r}"
    if iid.startswith("favourite_word"):
        word = {"favourite_word_like": "like", "favourite_word_itself": "itself",
                "favourite_word_per_se": "per se"}[iid]
        return f"'{word}' {'found' if _PARSED_CHECKERS[iid](p) else 'not found'}"
    if iid.startswith("sentence_length"):
        counts = p.word_counts
        if iid.endswith("short"):
            return f"longest sentence has {max(counts)} words (at most 18 allowed)"
        return f"shortest sentence has {min(counts)} words (at least 18 needed)"
    parity = 0 if iid == "number_even" else 1
    hits = [v for v in p.integers if v > 5 and v % 2 == parity]
    kind = "even" if parity == 0 else "odd"
    if hits:
        return f"{kind} number(s) > 5: {', '.join(map(str, hits[:5]))}"
    found = ", ".join(map(str, p.integers[:5])) or "none"
    return f"no {kind} number > 5 (integers found: {found})"


def _public(iid: str) -> Callable[..., bool]:
    fn = _PARSED_CHECKERS[iid]

    def check(response: str, number_words: bool = False) -> bool:
        return fn(ParsedResponse(response, number_words))
    check.__name__ = f"check_{iid}"
    check.__doc__ = f"Strict check of: {INSTRUCTION_TEXTS[iid]}"
    return check


check_response_length_short = _public("response_length_short")
check_response_length_long = _public("response_length_long")
check_start_char_S = _public("start_char_S")
check_start_char_B = _public("start_char_B")
check_end_char_question = _public("end_char_question")
check_end_char_exclamation = _public("end_char_exclamation")
check_favourite_word_like = _public("favourite_word_like")
check_favourite_word_itself = _public("favourite_word_itself")
check_favourite_word_per_se = _public("favourite_word_per_se")
check_sentence_length_short = _public("sentence_length_short")
check_sentence_length_long = _public("sentence_length_long")
check_number_even = _public("number_even")
check_number_odd = _public("number_odd")

#: instruction id -> public strict checker ``check(response) -> bool``
CHECKERS: Dict[str, Callable[..., bool]] = {iid: globals()[f"check_{iid}"] for iid in INSTRUCTION_IDS}


def _loose_variants(response: str) -> List[str]:
    """IFEval-style loose variants: first/last line removed, '*' removed, and combinations."""
    lines = response.split("\n")
    bases = [response, "\n".join(lines[1:]), "\n".join(lines[:-1]), "\n".join(lines[1:-1])]
    out: List[str] = []
    for b in bases:
        for v in (b, b.replace("*", "")):
            if v not in out:
                out.append(v)
    return out


def readable(text: str) -> str:
    """The text a reader sees: canonical composition (NFC: ``e`` + combining accent reads as ``é``)
    and no invisible format characters (zero-width spaces and joiners, bidi marks), which would
    otherwise hide a sentence's end or split a word."""
    return "".join(ch for ch in unicodedata.normalize("NFC", text) if unicodedata.category(ch) != "Cf")


def check_instructions(response: Optional[str], instructions: Sequence[str], loose: bool = False,
                       number_words: bool = False) -> List[bool]:
    """Whether ``response`` follows each instruction (ids or texts), in order.

    Strict by default; ``loose`` counts an instruction followed if any loose variant of the
    response follows it. An empty (or non-string) response follows nothing.
    """
    ids = [instruction_id(i) for i in instructions]
    text = readable(response) if isinstance(response, str) else ""
    if not text.strip():
        return [False] * len(ids)
    if not loose:
        parsed = ParsedResponse(text, number_words)
        return [_PARSED_CHECKERS[i](parsed) for i in ids]
    return verdicts(text, ids, number_words)[1]


def verdicts(response: Optional[str], instructions: Sequence[str],
             number_words: bool = False) -> Tuple[List[bool], List[bool], List[str]]:
    """(strict, loose, reasons) for each instruction, from one parse of the response.

    Why one call: the metric needs all three per turn; the response is parsed once and each
    loose variant only for the instructions that the strict check rejects.
    """
    ids = [instruction_id(i) for i in instructions]
    text = readable(response) if isinstance(response, str) else ""
    if not text.strip():
        return [False] * len(ids), [False] * len(ids), ["empty response"] * len(ids)
    parsed = ParsedResponse(text, number_words)
    strict = [_PARSED_CHECKERS[i](parsed) for i in ids]
    reasons = [_explain(parsed, i) for i in ids]
    loose = list(strict)
    if not all(strict):
        variants = [ParsedResponse(v, number_words) for v in _loose_variants(text)[1:] if v.strip()]
        for j, iid in enumerate(ids):
            if not strict[j]:
                loose[j] = any(_PARSED_CHECKERS[iid](v) for v in variants)
    return strict, loose, reasons


def check_instruction(response: Optional[str], instruction: str, loose: bool = False,
                      number_words: bool = False) -> bool:
    """One instruction (id or text)."""
    return check_instructions(response, [instruction], loose, number_words)[0]


def pif(response: Optional[str], instructions: Sequence[str], loose: bool = False,
        number_words: bool = False) -> float:
    """PIF(X, Y): fraction of the given instructions that the response follows.

    With no instruction given the score is 1.0, as in the paper (Fig. 5) and the release CSV.
    """
    if not instructions:
        return 1.0
    followed = check_instructions(response, instructions, loose, number_words)
    return sum(followed) / len(followed)
