"""MMMT-IF: programmatic instruction checkers and the PIF family of metrics.

The paper (MMMT-IF, Table 6) lists 13 instructions in 6 categories but does not publish
how a response is split into sentences or what a word or a number is. Those definitions
live here, once, and are written out precisely in docs/mmmt_if.md; every checker works on
one shared parse of the response so all 13 checks cost little more than one.

Public API: ``pif(response, instructions)``, ``check_instructions(response, instructions)``,
``check_instruction``, the 13 ``check_*`` functions, ``instruction_id`` (text -> id),
``split_sentences``, ``count_words``, ``find_integers`` and the registered metric ``pif``.
"""
from __future__ import annotations

import logging
import math
import re
from collections import defaultdict
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from metrics import register_metric
from utils.errors import ReformError, input_error

logger = logging.getLogger(__name__)

# ---------------------------------------------------------------------------------------
# The instruction set (paper Table 6) and text recognition
# ---------------------------------------------------------------------------------------

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


# ---------------------------------------------------------------------------------------
# Parsing a response: sentences, words, numbers
# ---------------------------------------------------------------------------------------

#: abbreviations after which a period never ends a sentence
NEVER_END = frozenset("""mr mrs ms dr prof sr jr st mt vs e.g i.e cf approx fig figs no nos vol
vols ca ed eds gen col lt sgt capt rev hon pp viz al""".split())
#: abbreviations that end a sentence only when the next word starts with a capital letter
MAYBE_END = frozenset("""etc a.m p.m u.s u.k u.n inc ltd co corp jan feb mar apr jun jul aug sep
sept oct nov dec""".split())

_CLOSERS = "\"'”’»)]}*_`~"
_LINE_MARKER_RE = re.compile(r"^(?:#{1,6}\s+|>\s*|[-*+•–]\s+|\(?\d{1,3}[.)]\s+)+")
#: a sentence-ending mark run, its closing quotes/brackets/markup, then whitespace
_BOUNDARY_RE = re.compile(r"([.!?]+[\"'”’»)\]}*_`~]*)\s+")
_MARKER_ONLY_RE = re.compile(r"^[\s*_#>\-+•–]*\(?\d{1,3}[.)][\s*_]*$")
_INLINE_MARKER_RE = re.compile(r"[:;]\s+\(?\d{1,2}\.$")
_HAS_ALNUM_RE = re.compile(r"[^\W_]")
_LIKE_RE = re.compile(r"like(?<![\w'’\-]like)(?![\w'’\-])")
_ITSELF_RE = re.compile(r"itself(?<![\w'’\-]itself)(?![\w'’\-])")
_PER_SE_RE = re.compile(r"per(?<![\w'’\-]per)[ \t\u00a0]+se(?![\w'’\-])")
#: a digit run (optionally signed) with inner ',' / '.' groups and trailing letters, not
#: inside a word; find_integers validates the token (decimals, suffixes, thousands groups)
_NUM_CAND_RE = re.compile(r"[-−0-9](?:(?<=[-−])(?<![\w\-−.,][-−])(?=[0-9])|(?<=[0-9])(?<!\w[0-9])(?<![.,][0-9]))"
                          r"[0-9]*(?:[0-9,.]*[0-9])?[^\W\d_]*")
_THOUSANDS_RE = re.compile(r"[0-9]{1,3}(?:,[0-9]{3})+")
_ORDINALS = ("", "st", "nd", "rd", "th")
_NUMBER_WORDS = {w: i for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
    "fifteen sixteen seventeen eighteen nineteen".split())}
_NUMBER_WORDS.update({w: 10 * (i + 2) for i, w in enumerate(
    "twenty thirty forty fifty sixty seventy eighty ninety".split())})
_NUMBER_WORDS.update({"hundred": 100, "thousand": 1000, "million": 1000000})
_NUMBER_WORD_RE = re.compile(r"(?<![\w'’\-])(" + "|".join(sorted(_NUMBER_WORDS, key=len, reverse=True))
                             + r")(?:[-\s](one|two|three|four|five|six|seven|eight|nine))?(?![\w'’\-])", re.I)


def _strip_marker(sentence: str) -> str:
    return _LINE_MARKER_RE.sub("", sentence, count=1) if sentence[:1] in _MARKER_START else sentence


_MARKER_START = frozenset("#>-*+•–(0123456789")


def _ends_sentence(piece: str, mark: str, nxt: str) -> bool:
    """Whether ``mark`` (a run of . ! ? and closers) after ``piece`` ends a sentence."""
    if mark != ".":
        if mark[0] == "." and mark.rstrip(_CLOSERS) == "...":
            return nxt.isupper()  # an ellipsis ends a sentence only before a capital
        return True
    token = piece[piece.rfind(" ") + 1:].lstrip(_CLOSERS + "(").lower()
    if len(token) > 6:
        return True
    if token in NEVER_END or (len(token) == 1 and token.isalpha()):
        return False
    if token in MAYBE_END:
        return nxt.isupper()
    return True


def _split_line(line: str) -> List[str]:
    """Sentences of one line (no line breaks inside)."""
    parts = _BOUNDARY_RE.split(line)
    if len(parts) == 1:
        return parts
    out: List[str] = []
    cur = ""
    last = len(parts) - 1
    for i in range(0, last, 2):
        piece, mark = parts[i], parts[i + 1]
        cur = f"{cur} {piece}{mark}" if cur else piece + mark
        if _ends_sentence(piece, mark, parts[i + 2][:1]):
            m = _INLINE_MARKER_RE.search(cur) if mark == "." else None
            if m is not None:  # "... differences: 1. **Body**": the list starts a sentence
                cur = cur[:m.start() + 1]
            out.append(cur)
            cur = ""
    out.append(f"{cur} {parts[last]}" if cur else parts[last])
    return out


def split_sentences(text: str) -> List[str]:
    """Split a response into sentences (see docs/mmmt_if.md, "Sentences").

    Line breaks end sentences; heading, quote, bullet and numbered-list markers are
    stripped; '.', '!', '?' (after closing quotes/brackets/markup) end a sentence when
    followed by whitespace, except after listed abbreviations, initials and ellipses
    before a lower-case word. Pieces without any letter or digit are not sentences.
    """
    sentences: List[str] = []
    has_alnum = _HAS_ALNUM_RE.search
    for line in str(text).splitlines():
        line = line.strip()
        if not line:
            continue
        pending = ""
        for piece in _split_line(_strip_marker(line)):
            if pending:
                piece = _strip_marker(pending + piece)
                pending = ""
            elif piece[:1] in _MARKER_START:
                if _MARKER_ONLY_RE.match(piece):  # "2." before an inline list item
                    pending = piece + " "
                    continue
                piece = _strip_marker(piece)
            if piece and has_alnum(piece):
                sentences.append(piece)
    return sentences


def count_words(sentence: str) -> int:
    """Words: whitespace-separated tokens that contain at least one letter or digit."""
    n = 0
    has_alnum = _HAS_ALNUM_RE.search
    for w in sentence.split():
        if w[0].isalnum() or has_alnum(w):
            n += 1
    return n


def _integer_value(tok: str) -> Optional[int]:
    """The value of a digit token like '1,024' or '8th'; None for decimals and words like '3D'."""
    i = len(tok)
    while not tok[i - 1].isdigit():
        i -= 1
    if tok[i:].lower() not in _ORDINALS:
        return None
    core = tok[:i]
    if "." in core:
        return None
    if "," in core:
        if not _THOUSANDS_RE.fullmatch(core):
            return None
        core = core.replace(",", "")
    return int(core)


def find_integers(text: str, number_words: bool = False) -> List[int]:
    """Integers written in digits (see docs/mmmt_if.md, "Numbers"); words only if asked."""
    values: List[int] = []
    for tok in _NUM_CAND_RE.findall(text):
        if tok.isdigit():
            values.append(int(tok))
            continue
        neg = tok[0] in "-−"
        v = _integer_value(tok[1:] if neg else tok)
        if v is not None:
            values.append(-v if neg else v)
    if number_words:
        for m in _NUMBER_WORD_RE.finditer(text):
            v = _NUMBER_WORDS[m.group(1).lower()]
            unit = _NUMBER_WORDS[m.group(2).lower()] if m.group(2) else None
            if unit is not None and 20 <= v < 100 and v % 10 == 0:
                values.append(v + unit)  # "twenty-one"
            else:
                values.append(v)
                if unit is not None:
                    values.append(unit)
    return values


def _first_alnum(sentence: str) -> str:
    for ch in sentence:
        if ch.isalnum():
            return ch
    return ""


def _last_mark(sentence: str) -> str:
    s = sentence.rstrip().rstrip(_CLOSERS + " \t")
    return s[-1] if s else ""


class ParsedResponse:
    """One response parsed once; every checker reads the parts it needs (lazily)."""

    __slots__ = ("text", "number_words", "_sentences", "_word_counts", "_ints", "_lower")

    def __init__(self, text: Optional[str], number_words: bool = False) -> None:
        self.text = text if isinstance(text, str) else ""
        self.number_words = number_words
        self._sentences: Optional[List[str]] = None
        self._word_counts: Optional[List[int]] = None
        self._ints: Optional[List[int]] = None
        self._lower: Optional[str] = None

    @property
    def lower(self) -> str:
        if self._lower is None:
            self._lower = self.text.lower()
        return self._lower

    @property
    def sentences(self) -> List[str]:
        if self._sentences is None:
            self._sentences = split_sentences(self.text)
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
    return 1 <= len(p.sentences) <= 4


def _response_length_long(p: ParsedResponse) -> bool:
    return len(p.sentences) >= 5


def _starts_with(letter: str) -> Callable[[ParsedResponse], bool]:
    def check(p: ParsedResponse) -> bool:
        s = p.sentences
        return bool(s) and all(_first_alnum(x).lower() == letter for x in s)
    return check


def _ends_with(mark: str) -> Callable[[ParsedResponse], bool]:
    def check(p: ParsedResponse) -> bool:
        s = p.sentences
        return bool(s) and all(_last_mark(x) == mark for x in s)
    return check


def _has(pattern: "re.Pattern[str]") -> Callable[[ParsedResponse], bool]:
    def check(p: ParsedResponse) -> bool:
        return pattern.search(p.lower) is not None
    return check


def _sentence_length_short(p: ParsedResponse) -> bool:
    # the whitespace-token count bounds the word count from above: count exactly only when needed
    s = p.sentences
    return bool(s) and all(len(x.split()) <= 18 or count_words(x) <= 18 for x in s)


def _sentence_length_long(p: ParsedResponse) -> bool:
    s = p.sentences
    return bool(s) and all(len(x.split()) >= 18 and count_words(x) >= 18 for x in s)


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
    "favourite_word_like": _has(_LIKE_RE),
    "favourite_word_itself": _has(_ITSELF_RE),
    "favourite_word_per_se": _has(_PER_SE_RE),
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
    iid = instruction_id(instruction)
    text = response if isinstance(response, str) else ""
    if not text.strip():
        return "empty response"
    p = ParsedResponse(text, number_words)
    sents = p.sentences
    n = len(sents)
    if iid.startswith("response_length"):
        return f"{n} sentence{'s' * (n != 1)} (needs {'1-4' if iid.endswith('short') else 'at least 5'})"
    if not sents and (iid.startswith(("start_char", "end_char", "sentence_length"))):
        return "no sentence found"
    if iid.startswith("start_char"):
        letter = iid[-1].lower()
        bad = _first_failing(sents, lambda x: _first_alnum(x).lower() == letter)
        if bad is None:
            return f"all {n} sentences start with {letter.upper()}"
        return f"sentence {bad + 1} of {n} starts with {_first_alnum(sents[bad])!r}"
    if iid.startswith("end_char"):
        mark = "?" if iid.endswith("question") else "!"
        bad = _first_failing(sents, lambda x: _last_mark(x) == mark)
        if bad is None:
            return f"all {n} sentences end with {mark}"
        return f"sentence {bad + 1} of {n} ends with {_last_mark(sents[bad])!r}"
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


def check_instructions(response: Optional[str], instructions: Sequence[str], loose: bool = False,
                       number_words: bool = False) -> List[bool]:
    """Whether ``response`` follows each instruction (ids or texts), in order.

    Strict by default; ``loose`` counts an instruction followed if any loose variant of the
    response follows it. An empty (or non-string) response follows nothing.
    """
    ids = [instruction_id(i) for i in instructions]
    text = response if isinstance(response, str) else ""
    if not text.strip():
        return [False] * len(ids)
    if not loose:
        parsed = ParsedResponse(text, number_words)
        return [_PARSED_CHECKERS[i](parsed) for i in ids]
    variants = [ParsedResponse(v, number_words) for v in _loose_variants(text) if v.strip()]
    return [any(_PARSED_CHECKERS[i](v) for v in variants) for i in ids]


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


# ---------------------------------------------------------------------------------------
# Corpus statistics
# ---------------------------------------------------------------------------------------

def bernoulli_ci(values: Sequence[float], z: float = 1.96) -> Tuple[float, float, float]:
    """(mean, low, high): normal approximation with the Bernoulli variance p(1-p)/n.

    Why Bernoulli: among distributions on [0, 1] with a given mean it has the largest
    variance, so the interval is conservative (as in the paper).
    """
    n = len(values)
    if n == 0:
        return float("nan"), float("nan"), float("nan")
    p = float(sum(values)) / n
    half = z * math.sqrt(max(p * (1.0 - p), 0.0) / n)
    return p, max(0.0, p - half), min(1.0, p + half)


def pif_n_k(pif_lists: Sequence[Sequence[float]], n: Optional[int] = None) -> Dict[int, float]:
    """PIF-N-K for K = 1..N: the fraction of turns where at least K of N responses have PIF 1."""
    if not pif_lists:
        return {}
    n = n or min(len(x) for x in pif_lists)
    perfect = [sum(1 for v in x[:n] if v >= 1.0 - 1e-12) for x in pif_lists]
    return {k: sum(1 for c in perfect if c >= k) / len(perfect) for k in range(1, n + 1)}


#: numpy percentile method used for PIF-IQR-N (Hyndman & Fan type 7, numpy's default)
IQR_METHOD = "linear"


def iqr(values: Sequence[float]) -> float:
    """Interquartile range Q3 - Q1 with linear interpolation between order statistics."""
    q1, q3 = np.percentile(np.asarray(values, dtype=float), [25, 75], method=IQR_METHOD)
    return float(q3 - q1)


def ecdf(values: Sequence[float]) -> List[List[float]]:
    """Empirical CDF as [[x, P(PIF <= x)], ...] at each distinct value x."""
    if not values:
        return []
    xs = sorted(values)
    n = len(xs)
    out: List[List[float]] = []
    for i, x in enumerate(xs):
        if i + 1 < n and xs[i + 1] == x:
            continue
        out.append([round(x, 6), (i + 1) / n])
    return out


def _fmt(x: Any) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.3f}"


def _record_responses(rec: Dict[str, Any]) -> List[str]:
    preds = rec.get("predictions")
    if isinstance(preds, list) and preds:
        return [p if isinstance(p, str) else "" for p in preds]
    p = rec.get("prediction")
    return [p if isinstance(p, str) else ""]


def _record_instructions(rec: Dict[str, Any], i: int) -> List[str]:
    meta = rec.get("meta") or {}
    if "instructions" not in meta:
        raise input_error("MMMT-IF prediction record has no meta.instructions",
                          record=rec.get("sample_id", i), field="meta.instructions")
    try:
        return [instruction_id(x) for x in meta["instructions"]]
    except ReformError as e:
        raise input_error(str(e), record=rec.get("sample_id", i), field="meta.instructions") from None


def sample_fields(rec: Dict[str, Any], response: str) -> Dict[str, Any]:
    """The per_sample fields shared with the accuracy metrics; the chat is the bootstrap unit
    and the checked response is what was 'extracted'."""
    meta = rec.get("meta") or {}
    answer = rec.get("answer_text", rec.get("answer"))
    return {"sample_id": rec.get("sample_id"), "dup_index": int(rec.get("dup_index", 0) or 0),
            "cluster": str(meta.get("chat_id", rec.get("sample_id"))), "question": rec.get("question"),
            "answer_text": None if answer is None else str(answer), "prediction": rec.get("prediction"),
            "extracted": response}


@register_metric("pif", benchmarks={"MMMT-IF": ["Generation"]})
def pif_metric(records: List[Dict[str, Any]], number_words: bool = False, **_: Any) -> Dict[str, Any]:
    """Score MMMT-IF predictions: PIF (strict and loose), breakdowns, PIF-N-K and PIF-IQR-N.

    PIF uses each record's first response ('prediction'); with N sampled responses
    ('predictions'), PIF-N-K (K=1..N), PIF-IQR-N and the mean PIF over all N are added.
    """
    per_sample: List[Dict[str, Any]] = []
    n_resp = min(len(_record_responses(r)) for r in records)
    if any(len(_record_responses(r)) != n_resp for r in records):
        logger.warning("MMMT-IF records have different numbers of responses; using N=%d", n_resp)
    for i, rec in enumerate(records):
        ids = _record_instructions(rec, i)
        responses = _record_responses(rec)[:n_resp]
        strict = [check_instructions(r, ids, number_words=number_words) for r in responses]
        loose0 = check_instructions(responses[0], ids, loose=True, number_words=number_words)
        pifs = [sum(f) / len(f) if f else 1.0 for f in strict]
        meta = rec.get("meta") or {}
        per_sample.append({
            **sample_fields(rec, responses[0]), "chat_id": meta.get("chat_id"), "turn": meta.get("turn"),
            "num_instructions": len(ids), "instructions": ids, "followed": strict[0], "followed_loose": loose0,
            "checks": [{"instruction": iid, "followed": ok, "followed_loose": ok_l,
                        "reason": explain_instruction(responses[0], iid, number_words)}
                       for iid, ok, ok_l in zip(ids, strict[0], loose0)],
            "pif": pifs[0], "pif_loose": sum(loose0) / len(loose0) if loose0 else 1.0,
            "pif_samples": pifs,
        })
    return summarize(per_sample, n_resp)


def summarize(per_sample: List[Dict[str, Any]], n_resp: int = 1) -> Dict[str, Any]:
    """Aggregate per-turn verdicts into the PIF metrics and the tables for the log."""
    pifs = [s["pif"] for s in per_sample]
    metrics: Dict[str, Any] = {
        "pif": float(np.mean(pifs)),
        "pif_loose": float(np.mean([s["pif_loose"] for s in per_sample])),
        "num_turns": len(per_sample),
        "num_chats": len({s["chat_id"] for s in per_sample}),
        "num_turns_without_instructions": sum(1 for s in per_sample if not s["instructions"]),
        "num_responses_per_turn": n_resp,
    }
    by_turn: Dict[int, List[float]] = defaultdict(list)
    by_num: Dict[int, List[float]] = defaultdict(list)
    cond: Dict[str, List[float]] = defaultdict(list)
    follow: Dict[str, List[bool]] = defaultdict(list)
    follow_loose: Dict[str, List[bool]] = defaultdict(list)
    for s in per_sample:
        if s["turn"] is not None:
            by_turn[int(s["turn"])].append(s["pif"])
        by_num[len(s["instructions"])].append(s["pif"])
        for iid, ok, ok_l in zip(s["instructions"], s["followed"], s["followed_loose"]):
            cond[iid].append(s["pif"])
            follow[iid].append(ok)
            follow_loose[iid].append(ok_l)
    metrics["pif_by_turn"] = {}
    for t in sorted(by_turn):
        m, lo, hi = bernoulli_ci(by_turn[t])
        metrics["pif_by_turn"][str(t)] = {"pif": m, "ci95_low": lo, "ci95_high": hi, "n": len(by_turn[t])}
    metrics["pif_by_num_instructions"] = {str(k): {"pif": float(np.mean(v)), "n": len(v)}
                                          for k, v in sorted(by_num.items())}
    metrics["pif_by_instruction"] = {
        iid: {"pif_given": float(np.mean(cond[iid])), "followed": float(np.mean(follow[iid])),
              "followed_loose": float(np.mean(follow_loose[iid])), "n": len(cond[iid])}
        for iid in INSTRUCTION_IDS if iid in cond}
    metrics["pif_ecdf"] = {"all": ecdf(pifs), "by_turn": {str(t): ecdf(v) for t, v in sorted(by_turn.items())}}
    samples = [s["pif_samples"] for s in per_sample]
    nk = pif_n_k(samples, n_resp)
    for k, v in nk.items():
        metrics[f"pif_{n_resp}_{k}"] = v
    metrics[f"pif_iqr_{n_resp}"] = float(np.mean([iqr(x) for x in samples]))
    metrics["pif_iqr_method"] = f"numpy.percentile method='{IQR_METHOD}' (Hyndman-Fan type 7)"
    metrics["pif_mean_over_samples"] = float(np.mean([np.mean(x) for x in samples]))
    return {"metrics": metrics, "per_sample": per_sample, "tables": _tables(metrics, n_resp)}


def _tables(m: Dict[str, Any], n_resp: int) -> Dict[str, str]:
    rows = ["| turn | n | PIF | 95% CI |", "|---:|---:|---:|---|"]
    for t, v in m["pif_by_turn"].items():
        rows.append(f"| {t} | {v['n']} | {_fmt(v['pif'])} | [{_fmt(v['ci95_low'])}, {_fmt(v['ci95_high'])}] |")
    per_turn = "\n".join(rows)
    rows = ["| instruction | category | n | followed (strict) | followed (loose) | PIF given it |",
            "|---|---|---:|---:|---:|---:|"]
    for iid, v in m["pif_by_instruction"].items():
        rows.append(f"| {iid} | {CATEGORY_OF[iid]} | {v['n']} | {_fmt(v['followed'])} | "
                    f"{_fmt(v['followed_loose'])} | {_fmt(v['pif_given'])} |")
    per_instr = "\n".join(rows)
    rows = ["| instructions given | n | PIF |", "|---:|---:|---:|"]
    for k, v in m["pif_by_num_instructions"].items():
        rows.append(f"| {k} | {v['n']} | {_fmt(v['pif'])} |")
    by_num = "\n".join(rows)
    rows = ["| metric | value |", "|---|---:|", f"| PIF (strict) | {_fmt(m['pif'])} |",
            f"| PIF (loose) | {_fmt(m['pif_loose'])} |"]
    for k in range(1, n_resp + 1):
        rows.append(f"| PIF-{n_resp}-{k} | {_fmt(m[f'pif_{n_resp}_{k}'])} |")
    rows.append(f"| PIF-IQR-{n_resp} | {_fmt(m[f'pif_iqr_{n_resp}'])} |")
    return {"MMMT-IF summary": "\n".join(rows), "MMMT-IF PIF by turn": per_turn,
            "MMMT-IF PIF by instruction": per_instr, "MMMT-IF PIF by number of instructions": by_num}
