"""Words and numbers of a model response, as the MMMT-IF checkers read them.

Why one module: the favourite-word, sentence-length and number instructions each need a
precise notion of a word or a number that the paper leaves open; the rules are written
out in docs/mmmt_if.md ("Words", "Favourite word", "Numbers"). Every function here is
linear in its input (tests/test_pif_linear.py).
"""
from __future__ import annotations

import re
from typing import List, Optional

#: em and en dashes (and a run of two or more hyphens, the typed em dash) separate words
_DASH_RE = re.compile(r"[\u2014\u2013\u2015]|-{2,}")
#: a word: from its first letter or digit to the next whitespace or dash (possessive, so a
#: token is read once and counted once)
_WORD_RE = re.compile(r"[^\W_][^\s\u2014\u2013\u2015]*+")
#: a digit run longer than this is no number a reader takes in (and int() would refuse it)
MAX_DIGITS = 100


def _word_re(word: str) -> "re.Pattern[str]":
    """A word used as a word: not fused to letters, digits or a hyphen; an apostrophe or
    quote beside it is a quote unless it joins it to another letter (don't, like's)."""
    head, _, rest = word.partition(" ")
    # the literal first, then look behind it: a fast scan for the (rare) word. Letters,
    # digits and hyphens join words; '_' does not (markdown _itself_); an apostrophe joins
    # only when a letter or digit is on its other side (like's), else it is a quote ('like')
    body = (head + rf"(?<![^\W_]{head})(?<!-{head})(?<![^\W_]['’]{head})"
            + (r"\s++" + rest if rest else ""))
    return re.compile(body + r"(?!['’][^\W_])(?![^\W_])(?!-)")


LIKE_RE = _word_re("like")
ITSELF_RE = _word_re("itself")
PER_SE_RE = _word_re("per se")
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


def count_words(sentence: str) -> int:
    """Words: tokens separated by whitespace or by em/en dashes ("lighthouse—a tower" is
    three words) that contain at least one letter or digit."""
    if "--" in sentence:
        sentence = _DASH_RE.sub(" ", sentence)
    return len(_WORD_RE.findall(sentence))


def has_dash(sentence: str) -> bool:
    """Whether a dash may join two words (then whitespace tokens undercount the words)."""
    return "\u2014" in sentence or "\u2013" in sentence or "\u2015" in sentence or "--" in sentence


def _integer_value(core: str) -> Optional[int]:
    """The value of a digit token like '1,024'; None for decimals and other comma patterns."""
    if "." in core:
        return None
    if "," in core:
        if not _THOUSANDS_RE.fullmatch(core):
            return None
        core = core.replace(",", "")
    return int(core) if len(core) <= MAX_DIGITS else None


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
        if len(tok) > MAX_DIGITS + MAX_DIGITS // 3:
            continue
        v = int(tok) if tok.isdigit() and len(tok) <= MAX_DIGITS else _integer_value(tok)
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
