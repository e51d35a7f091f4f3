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
from utils.predictions import register_prediction_file_reader

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

#: abbreviations after which a period never ends a sentence ("no" only before a number)
NEVER_END = frozenset("""mr mrs ms dr prof sr jr st mt vs e.g i.e cf approx fig figs no nos vol
vols ca ed eds gen col lt sgt capt rev hon pp viz al""".split())
#: abbreviations that end a sentence only when the next word starts with a capital letter
MAYBE_END = frozenset("""etc inc ltd co corp jan feb mar apr jun jul aug sep sept oct nov dec""".split())
#: words that start a new sentence after an initial or initialism ("in the U.S. It rained")
SENTENCE_STARTERS = frozenset("""a an the this that these those it its he she they we i you there here
his her their our my your in on at for but and so however also then next overall both each some many
most all one as if when while although yes no after before finally first second third additionally
moreover furthermore thus therefore what which who how why where with by from another other such since
because instead besides meanwhile today now only""".split())

_CLOSERS = "\"'”’»)]}*_`~"
_LINE_MARKER_RE = re.compile(r"^(?:#{1,6}\s+|>\s*|[-*+•–]\s+|\(?\d{1,3}[.)]\s+)+")
#: a sentence-ending mark run (… counts as ...), its closing quotes/brackets/markup, then whitespace
_BOUNDARY_RE = re.compile(r"([.!?…]+[\"'”’»)\]}*_`~]*)\s+")
_MARKER_ONLY_RE = re.compile(r"^[\s*_#>\-+•–]*\(?\d{1,3}[.)][\s*_]*$")
_INLINE_MARKER_RE = re.compile(r"[:;]\s+\(?\d{1,2}\.$")
_HAS_ALNUM_RE = re.compile(r"[^\W_]")
_INITIALISM_RE = re.compile(r"[a-z]|(?:[a-z]{1,2}\.)+[a-z]{1,2}")
#: a line that is a title by itself: wholly bold/italic (optionally ending with ':')
_EMPHASIS_LINE_RE = re.compile(r"^([*_]{1,3})[^*_].*\1:?$")
#: a horizontal rule ('---', '***', '___')
_RULE_RE = re.compile(r"[-*_=~\s]{3,}")
#: a word used as a word: not fused to letters, digits or a hyphen; an apostrophe or
#: quote beside it is a quote unless it joins it to another letter (don't, like's)
def _word_re(word: str) -> "re.Pattern[str]":
    head, _, rest = word.partition(" ")
    # the literal first, then look behind it: a fast scan for the (rare) word. Letters,
    # digits and hyphens join words; '_' does not (markdown _itself_); an apostrophe joins
    # only when a letter or digit is on its other side (like's), else it is a quote ('like')
    body = (head + rf"(?<![^\W_]{head})(?<!-{head})(?<![^\W_]['’]{head})"
            + (r"\s+" + rest if rest else ""))
    return re.compile(body + r"(?!['’][^\W_])(?![^\W_])(?!-)")


_LIKE_RE = _word_re("like")
_ITSELF_RE = _word_re("itself")
_PER_SE_RE = _word_re("per se")
#: a sign or digit and what may follow inside a number; find_integers checks the context
_NUM_RUN_RE = re.compile(r"[-−0-9][0-9,.]*")
_THOUSANDS_RE = re.compile(r"[0-9]{1,3}(?:,[0-9]{3})+")
_NUMBER_WORDS = {w: i for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
    "fifteen sixteen seventeen eighteen nineteen".split())}
_NUMBER_WORDS.update({w: 10 * (i + 2) for i, w in enumerate(
    "twenty thirty forty fifty sixty seventy eighty ninety".split())})
_NUMBER_WORDS.update({"hundred": 100, "thousand": 1000, "million": 1000000})
_NUMBER_WORD_RE = re.compile(r"(?<![\w'’\-])(" + "|".join(sorted(_NUMBER_WORDS, key=len, reverse=True))
                             + r")(?:[-\s](one|two|three|four|five|six|seven|eight|nine))?(?![\w'’\-])", re.I)

_MARKER_START = frozenset("#>-*+•–(0123456789")


def _strip_marker(sentence: str) -> str:
    return _LINE_MARKER_RE.sub("", sentence, count=1) if sentence[:1] in _MARKER_START else sentence


def _next_word(text: str) -> str:
    return text.split(None, 1)[0].strip(_CLOSERS + "(\"'“‘").lower() if text.strip() else ""


def _ends_sentence(piece: str, mark: str, nxt_text: str) -> bool:
    """Whether ``mark`` (a run of . ! ? … and closers) after ``piece`` ends a sentence."""
    nxt = nxt_text[:1]
    if mark != ".":
        core = mark.rstrip(_CLOSERS).replace("…", "...")
        if core[0] == "." and core.strip(".") == "" and len(core) > 1:
            return nxt.isupper()  # an ellipsis ends a sentence only before a capital
        return True
    token = piece[piece.rfind(" ") + 1:].lstrip(_CLOSERS + "(").lower()
    if len(token) > 6:
        return True
    if token in NEVER_END:
        # "No. It is a stork." ends; "No. 5" (number) does not
        return token in ("no", "nos") and not (nxt.isdigit() or nxt == "#")
    if _INITIALISM_RE.fullmatch(token):
        # initials and initialisms (J. K., U.S., D.C.) end only before a sentence-opening word
        return nxt.isupper() and _next_word(nxt_text) in SENTENCE_STARTERS
    if token in MAYBE_END:
        return nxt.isupper()
    return True


def _split_line(line: str) -> List[str]:
    """Sentences of one block (line breaks already resolved)."""
    parts = _BOUNDARY_RE.split(line)
    if len(parts) == 1:
        return parts
    out: List[str] = []
    cur = ""
    last = len(parts) - 1
    for i in range(0, last, 2):
        piece, mark = parts[i], parts[i + 1]
        cur = f"{cur} {piece}{mark}" if cur else piece + mark
        if _ends_sentence(piece, mark, parts[i + 2]):
            m = _INLINE_MARKER_RE.search(cur) if mark == "." else None
            if m is not None:  # "... differences: 1. **Body**": the list starts a sentence
                cur = cur[:m.start() + 1]
            out.append(cur)
            cur = ""
    out.append(f"{cur} {parts[last]}" if cur else parts[last])
    return out


def _is_item(line: str) -> bool:
    """A line that starts a block of its own: list item, heading, quote, table row."""
    c = line[0]
    if c == "|" or (c in _MARKER_START and _LINE_MARKER_RE.match(line) is not None):
        return True
    return c in "-*_=~" and _RULE_RE.fullmatch(line) is not None


#: lower-case words allowed inside a title line ("Overview of the Scene")
_TITLE_SMALL = frozenset("a an the of and or in on at to for with by from vs".split())


def _is_title(line: str) -> bool:
    """A short Title Case line without closing punctuation ("Key Features"): a heading."""
    words = line.split()
    if len(words) > 6 or line[-1] in ".!?…,;" or not words[0][:1].isupper():
        return False
    return all(w[:1].isupper() or w.lower() in _TITLE_SMALL or not w[:1].isalpha() for w in words)


def _breaks_after(prev: str, prev_item: bool, line: str, indented: bool) -> bool:
    """Whether the line break between two non-empty lines ends a sentence.

    It does where the next line is an item (list, heading, quote, table row, rule) and where
    the previous line is complete on its own: a heading, table row or rule; a list item not
    continued (a continuation is indented or starts lower-case); a wholly bold/italic or
    short Title Case title line; a line ending with ':' before a capital. Otherwise the lines
    are one text and only punctuation ends sentences.
    """
    if _is_item(line):
        return True
    lower_next = line[0].islower()
    if prev_item:
        if prev[0] in "#|" or _RULE_RE.fullmatch(prev) is not None:
            return True
        return not (lower_next or indented)
    if lower_next:
        return False
    if prev[-1] == ":":
        return True
    if prev[0] in "*_" and _EMPHASIS_LINE_RE.match(prev) is not None:
        return True
    return _is_title(prev)


def _blocks(text: str) -> List[str]:
    """Lines joined into blocks: blank lines and sentence-ending line breaks separate them."""
    blocks: List[str] = []
    cur: List[str] = []
    prev = ""
    prev_item = False
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            if cur:
                blocks.append(" ".join(cur))
                cur = []
            continue
        if line[0] == ">" and cur and cur[0][0] == ">":
            # a quote continues over its '>' lines: read the quoted text like any other
            inner, prev_inner = line.lstrip("> \t"), prev.lstrip("> \t")
            if inner and prev_inner and not _breaks_after(prev_inner, False, inner, False):
                cur.append(inner)
                prev = line
                continue
        item = _is_item(line)
        if cur and _breaks_after(prev, prev_item, line, raw[:1] in " \t"):
            blocks.append(" ".join(cur))
            cur = []
        if not cur:
            prev_item = item
        cur.append(line)
        prev = line
    if cur:
        blocks.append(" ".join(cur))
    return blocks


def split_sentences(text: str) -> List[str]:
    """Split a response into sentences (see docs/mmmt_if.md, "Sentences").

    Lines are first joined into blocks (a wrapped sentence is one sentence; list items,
    headings, titles and blank lines end one); heading, quote, bullet and numbered-list
    markers are stripped; '.', '!', '?', '…' (after closing quotes/brackets/markup) end a
    sentence when followed by whitespace, except after listed abbreviations, initials
    not followed by a sentence-opening word, and ellipses before a lower-case word. Pieces
    without any letter or digit are not sentences.
    """
    sentences: List[str] = []
    has_alnum = _HAS_ALNUM_RE.search
    for block in _blocks(str(text)):
        pending = ""
        for piece in _split_line(_strip_marker(block)):
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


def _integer_value(core: str) -> Optional[int]:
    """The value of a digit token like '1,024'; None for decimals and other comma patterns."""
    if "." in core:
        return None
    if "," in core:
        if not _THOUSANDS_RE.fullmatch(core):
            return None
        core = core.replace(",", "")
    return int(core)


def find_integers(text: str, number_words: bool = False) -> List[int]:
    """Integers written in digits (see docs/mmmt_if.md, "Numbers"); words only if asked.

    A letter suffix is a unit or ordinal (8km, 35mm, 8th count); a letter directly before
    the digits makes a label (Image8, Photo12 do not count), except the 'x' of 8x10.
    """
    values: List[int] = []
    for m in _NUM_RUN_RE.finditer(text):
        tok, at = m.group(), m.start()
        prev = text[at - 1] if at else " "
        negative = False
        if tok[0] in "-−":
            if len(tok) == 1 or not tok[1].isdigit():
                continue
            negative = not (prev.isalnum() or prev in "_.,")  # "COVID-19", "10-12" are positive
            tok = tok[1:]
        elif prev.isalpha():
            if not (prev in "x×" and at > 1 and text[at - 2].isdigit()):
                continue  # a label such as Image8; the 10 of 8x10 is a number
        elif prev == "_":
            continue
        tok = tok.rstrip(",.")  # sentence punctuation after the number
        v = int(tok) if tok.isdigit() else _integer_value(tok)
        if v is not None:
            values.append(-v if negative else v)
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


def _reported_pif(rec: Dict[str, Any], i: int = 0) -> Optional[float]:
    """A precomputed per-turn PIF (release reference rows), used when there is no response."""
    v = rec.get("reported_pif")
    if v is None or rec.get("prediction") is not None or rec.get("predictions"):
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 <= float(v) <= 1.0:
        raise input_error(f"reported_pif must be a number in [0, 1], got {v!r}",
                          record=rec.get("sample_id", i), field="reported_pif")
    return float(v)


@register_metric("pif", benchmarks={"MMMT-IF": ["Generation"]})
def pif_metric(records: List[Dict[str, Any]], number_words: bool = False, **_: Any) -> Dict[str, Any]:
    """Score MMMT-IF predictions: PIF (strict and loose), breakdowns, PIF-N-K and PIF-IQR-N.

    PIF uses each record's first response ('prediction'); with N sampled responses
    ('predictions'), PIF-N-K (K=1..N), PIF-IQR-N and the mean PIF over all N are added.
    """
    per_sample: List[Dict[str, Any]] = []
    answered = [r for r in records if _reported_pif(r) is None]
    n_resp = min((len(_record_responses(r)) for r in answered), default=1)
    if any(len(_record_responses(r)) != n_resp for r in answered):
        logger.warning("MMMT-IF records have different numbers of responses; using N=%d", n_resp)
    for i, rec in enumerate(records):
        ids = _record_instructions(rec, i)
        reported = _reported_pif(rec, i)
        if reported is not None:
            # a released score without a response (metrics/mmmt_if_release.py): no verdicts
            meta = rec.get("meta") or {}
            per_sample.append({
                "sample_id": rec.get("sample_id"), "chat_id": meta.get("chat_id"), "turn": meta.get("turn"),
                "instructions": ids, "followed": None, "followed_loose": None, "pif": reported,
                "pif_loose": None, "pif_samples": [reported] * n_resp, "reported_pif": True,
            })
            continue
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
    loose = [s["pif_loose"] for s in per_sample if s["pif_loose"] is not None]
    metrics: Dict[str, Any] = {
        "pif": float(np.mean(pifs)),
        "pif_loose": float(np.mean(loose)) if loose else None,
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
        for j, iid in enumerate(s["instructions"]):
            cond[iid].append(s["pif"])
            if s["followed"] is not None:  # released scores carry no per-instruction verdicts
                follow[iid].append(s["followed"][j])
                follow_loose[iid].append(s["followed_loose"][j])
    metrics["pif_by_turn"] = {}
    for t in sorted(by_turn):
        m, lo, hi = bernoulli_ci(by_turn[t])
        metrics["pif_by_turn"][str(t)] = {"pif": m, "ci95_low": lo, "ci95_high": hi, "n": len(by_turn[t])}
    metrics["pif_by_num_instructions"] = {str(k): {"pif": float(np.mean(v)), "n": len(v)}
                                          for k, v in sorted(by_num.items())}
    metrics["pif_by_instruction"] = {
        iid: {"pif_given": float(np.mean(cond[iid])),
              "followed": float(np.mean(follow[iid])) if follow[iid] else None,
              "followed_loose": float(np.mean(follow_loose[iid])) if follow_loose[iid] else None,
              "n": len(cond[iid])}
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


def _read_release_csv(path: str) -> List[Dict[str, Any]]:
    from metrics.mmmt_if_release import read_release_records
    return read_release_records(path)


# `run_loader_eval --dataset_name MMMT-IF --prediction_file <release>.csv`: the released scores
register_prediction_file_reader("MMMT-IF", ".csv", _read_release_csv)
