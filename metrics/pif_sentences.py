"""Sentences of a model response, read as a careful person reads them, in linear time.

Five of the 13 MMMT-IF instructions count or inspect sentences, and the paper does not say
what a sentence is; the rules are written out in docs/mmmt_if.md ("Sentences") and each
one is pinned by tests/test_pif_sentences.py. Two passes, both linear in the text:
lines are joined into blocks and blocks cut at inline list markers (metrics/pif_lines.py),
then each item is cut at the end marks whose context (the word before, the word after, an
open quotation or parenthesis) says a sentence ends. Why our own code and not pySBD (see
docs/mmmt_if.md, "Sentences"): it reads the Golden Rules at least as well (48/48 against
47/48) and splits about 60 times as many responses per second (bench/pif.py --pysbd).
"""
from __future__ import annotations

import re
from typing import Iterator, List, Tuple

from .pif_lines import (CLOSERS, END_CHARS, HAS_ALNUM_RE, MARKER_ONLY_RE, MARKER_START, START_MARKER_RE,
                               blocks, list_cuts, strip_marker)

# ---------------------------------------------------------------------------------------
# Abbreviations and the words that open sentences
# ---------------------------------------------------------------------------------------

#: titles that stand before a name: never end a sentence ("Mr. Smith", "Dr. Lee")
TITLES = frozenset("mr mrs ms messrs dr prof gen col lt sgt capt rev hon mt".split())
#: abbreviations read inside a sentence, before what they introduce: never end one
NEVER_END = frozenset("e.g i.e cf vs viz approx ca a.k.a".split())
#: abbreviations before a number ("No. 5", "p. 55", "N°. 1026"): no end before a digit
NUMBER_ABBREVIATIONS = frozenset("no nos n° nº vol vols p pp fig figs ch para".split())
#: abbreviations that may end a sentence: they end one before a capitalised word
MAYBE_END = frozenset("""etc inc ltd co corp jr sr al ed eds bros dept est jan feb mar apr jun jul aug
sep sept oct nov dec""".split())
#: every abbreviation above: after any other short word a period ends the sentence
#: units after a number ("6 ft. tall"): like MAYBE_END, they end a sentence only before a
#: capitalised word
UNITS = frozenset("ft in yd yds mi lb lbs oz gal qt pt sq cu hr hrs min mins sec secs tbsp tsp".split())
#: emoji (pictographs, dingbats, variation selector, joiner, skin tones) written straight after an
#: end mark belong to the sentence it ends ("Done!\U0001F600 Next."), as closing quotes do
EMOJI = "\u2600-\u27bf\ufe0f\u200d\U0001f000-\U0001faff"
ABBREVIATIONS = TITLES | NEVER_END | NUMBER_ABBREVIATIONS | MAYBE_END | UNITS | {"st"}
#: time and era abbreviations after a number ("5 p.m.", "500 B.C."): end before a capitalised
#: word, except after an opening time phrase ("At 5 a.m. Mr. Smith went", "In 79 A.D. Pompeii")
TIMES = frozenset("a.m p.m b.c a.d b.c.e c.e".split())
#: words before an initialism that make it the name of a place, body or degree ("the U.K.",
#: "her Ph.D.", "Washington, D.C." after a comma), never a person's initials ("by J. K. Rowling")
DETERMINERS = frozenset("the a an his her their our my its your this that".split())
#: capitalised words that continue such a name after its initialism ("the U.S. Government",
#: "the U.K. Parliament archive", "the U.N. Security Council"); any other capitalised word
#: after "the U.K." opens a new sentence ("She moved to the U.K. Mary stayed.")
NAME_CONTINUATIONS = frozenset("""government navy army air marine marines senate congress parliament court
supreme department embassy consulate constitution open postal census president vice prime
secretary minister ministry treasury dollar dollars pound coast guard office home council security
general assembly ambassador border capitol federal national state highway route interstate attorney
bureau agency forest service space olympic team cup championship championships mint patent bank
house commission armed forces naval military intelligence customs immigration geological survey
virgin civil declaration pacific atlantic central command fleet midwest east west north south
representative representatives senator governor mail election elections economy market markets
program programme thesis dissertation student students candidate degree""".split())
#: words that open sentences: after an initial or initialism ("in the U.S. It rained") a
#: capitalised word from this list starts a new sentence; any other ("the U.S. Navy") does not
SENTENCE_STARTERS = frozenset("""a an the this that these those it its he she they we i you there here
his her their our my your in on at for but and so however also then next overall both each some many
most all one as if when while although yes no after before finally first second third additionally
moreover furthermore thus therefore what which who how why where with by from another other such since
because instead besides meanwhile today now only did do does is are was were can could will would
should may might must has have had let please note see everyone everybody everything nobody nothing
someone something anyone anything few several neither either later earlier soon still yet once again
even perhaps maybe indeed similarly likewise otherwise nevertheless nonetheless consequently hence
ultimately eventually initially currently recently generally typically usually often sometimes
together unfortunately fortunately clearly""".split())

_OPENERS = "(\"'“‘[*_`«"
_SUPERSCRIPTS = "¹²³⁰⁴⁵⁶⁷⁸⁹"
_TIME_OPENER_RE = re.compile(r"(?i)\s*(?:at|by|before|after|until|from|since|around|about|in)\s+\d{1,4}"
                             r"(?::\d\d)?\s*(?:[ap]\.m|b\.c\.e|b\.c|a\.d|c\.e)")
_INITIALISM_RE = re.compile(r"(?:[a-z]{1,2}\.)+[a-z]{1,2}")

# ---------------------------------------------------------------------------------------
# End marks and their context
# ---------------------------------------------------------------------------------------

#: an end-mark run (a spaced ellipsis ". . ." is one run), its closing quotes, brackets and
#: markup, and footnote markers ("[1]", "¹"), before whitespace or the end. Possessive, never
#: started inside a run, and a lone '.' that opens a spaced run is no candidate of its own,
#: so that every character is read a bounded number of times
_MARK_RE = re.compile(r"[.!?…](?<![.!?…][.!?…])(?:(?<=\.)(?<!\. \.)(?: \.)++|[.!?…]*+(?! \.))"
                      r"([\"'”’»)\]}*_`~" + EMOJI + r"]*+(?:\[\d{1,3}\]|[¹²³⁰⁴-⁹]++)*+)(?=\s|\Z)")
#: the word after a boundary: skipped whitespace, up to four opening characters, its letters
_NEXT_RE = re.compile(r"(\s*+)[(\"'“‘\[*_`«]{0,4}+([^\W\d_]{1,15}+|\S?)")
#: what opens a quotation or parenthesis, and what closes it
_PAIR_RE = re.compile(r"[()\[\]{}“”«»\"]")
_CLOSE_OF = {"(": ")", "[": "]", "{": "}", "“": "”", "«": "»"}
#: a quotation or parenthesis longer than this is taken to be unbalanced and ignored
_MAX_QUOTE = 150


def _inner_spans(text: str) -> List[Tuple[int, int]]:
    """(open, close) of quotations and parentheses opened inside a sentence.

    Why: an end mark inside them ('shouted "Storm ahead!" as') belongs to the outer
    sentence. One opened where a sentence starts ("No. (It is a stork.)") is read as text.
    A straight quote after whitespace or a bracket opens a quotation, any other closes the
    open one.
    """
    spans: List[Tuple[int, int]] = []
    stack: List[Tuple[str, int]] = []
    quote = -1
    for m in _PAIR_RE.finditer(text):
        c, at = m.group(), m.start()
        if c == '"':
            # a straight quote opens after whitespace or a bracket and closes before one
            before = text[at - 1] if at else " "
            if before.isspace() or before in "([{":
                quote = at
                continue
            if quote < 0:
                continue
            start, quote = quote, -1
        elif c in _CLOSE_OF:
            stack.append((_CLOSE_OF[c], at))
            continue
        elif stack and stack[-1][0] == c:
            start = stack.pop()[1]
        else:
            continue
        if at - start <= _MAX_QUOTE:
            k = start - 1
            while k >= 0 and text[k] in " \t":
                k -= 1
            if k >= 0 and text[k] not in END_CHARS and text[k] not in CLOSERS:
                spans.append((start, at))
    spans.sort()
    return spans


def _word_before(text: str, lo: int, end: int) -> Tuple[str, int]:
    """The token that ends at ``end`` (after the last whitespace from ``lo`` on) and its start."""
    start = max(text.rfind(" ", lo, end), text.rfind("\t", lo, end), lo - 1) + 1
    return text[start:end], start


def _next_word(text: str, q: int) -> str:
    """The word after position ``q`` (whitespace and up to four opening characters skipped),
    in its own case: its letters, or its first character when that is no letter."""
    m = _NEXT_RE.match(text, q)
    return m.group(2) if m else ""  # never None: every part of the pattern may match empty


def _ends(text: str, mark: str, closed: str, p: int, q: int, lo: int, sent_start: int, nxt: str) -> bool:
    """Whether the end mark ``mark`` at ``p`` (closers and footnotes ``closed`` up to ``q``)
    ends a sentence. ``lo`` is where the text since the previous end mark starts, ``nxt``
    the first character of the next word (after opening quotes and brackets).
    """
    upper, lower = nxt.isupper(), nxt.islower()
    if closed and lower:
        return False  # '"This is great." she said', '(... an engineer.) at the'
    if "!" in mark or "?" in mark:
        return not lower  # "Yahoo! in the accounting department"
    if mark != ".":  # an ellipsis: ". . .", "...", "…", "...."
        if p > 0 and text[p - 1] in "[(":
            return False  # "[...]" marks an omission
        detached = p > 0 and text[p - 1] in " \t"
        return upper and not (detached and _next_word(text, q) == "I")
    raw, start = _word_before(text, lo, p)
    token = raw.lstrip(_OPENERS).lower()
    if not token or len(token) > 6:
        return True
    if token in NUMBER_ABBREVIATIONS and (nxt.isdigit() or nxt == "#"):
        return False
    if token in ("no", "nos"):
        return True  # a standalone answer: "No. It is a stork."
    if token in TITLES or token in NEVER_END:
        return False
    if token in MAYBE_END or token in NUMBER_ABBREVIATIONS:
        return upper
    prev = _word_before(text, lo, start - 1)[0].lstrip(_OPENERS) if start > lo else ""
    if token in UNITS and prev[:1].isdigit():  # "6 ft. tall", but "6 ft. The"
        return upper
    if token == "st":  # "Main St. It is", but "the church of St. Michael"
        return upper and (prev[:1].isupper() or prev[:1].isdigit())
    if token in TIMES and (token[-1] == "m" or prev[:1].isdigit()):  # "at 6 p.m. Mr. Smith left", but "At 5 a.m. Mr. Smith went"
        return upper and _TIME_OPENER_RE.fullmatch(text, sent_start, p) is None
    if len(token) == 1 and token.isalpha():
        if not upper:
            return False
        if _next_word(text, q).lower() in SENTENCE_STARTERS:
            return True
        # "rich in vitamin C. Apples", "you and I. Did" end; a name's initial ("Jonas E.
        # Smith", "J. K. Rowling", "A. Smith" opening a sentence) does not
        return prev[:1].islower() or prev[:1].isdigit()
    if _INITIALISM_RE.fullmatch(token):
        if not upper:
            return False
        word = _next_word(text, q).lower()
        if word in SENTENCE_STARTERS:
            return True
        # the name of a place, body or degree ("the U.K.", "a Ph.D.", "Washington, D.C.") ends
        # before a capitalised word that does not continue it ("the U.K. Mary stayed" is two,
        # "the U.K. Parliament" one); a person's initials ("by J.K. Rowling") never end there
        named = prev.lower() in DETERMINERS or prev.endswith(",")
        return named and word not in NAME_CONTINUATIONS
    return True


def _plain_word(token: str) -> bool:
    """A token after which a period always ends a sentence: a word of more than 6 characters
    or of 2-6 letters that is no abbreviation."""
    if len(token) > 6:
        return "\t" not in token
    return len(token) > 1 and token.isalpha() and token.lower() not in ABBREVIATIONS


def _split_segment(text: str) -> Iterator[str]:
    """Sentences of one list item or block: cut where an end mark ends a sentence."""
    spans = _inner_spans(text) if ('"' in text or "(" in text or "\u201c" in text or "[" in text
                                   or "\u00ab" in text or "{" in text) else []
    n_spans, si, max_close = len(spans), 0, -1
    sent_start = lo = 0
    n = len(text)
    for m in _MARK_RE.finditer(text):
        q, p = m.end(), m.start()
        if n_spans:
            while si < n_spans and spans[si][0] < p:
                max_close = max(max_close, spans[si][1])
                si += 1
            if q <= max_close:
                continue  # inside a quotation or parenthesis opened in this sentence
        nxt = text[q + 1] if q + 1 < n and text[q] == " " else ""
        if not nxt.isalnum():
            nxt = _next_word(text, q)[:1]
        if q - p == 1 and text[p] != ".":
            ends = not nxt.islower()  # the common '!' and '?'
        elif q - p == 1 and _plain_word(text[max(text.rfind(" ", lo, p), lo - 1) + 1:p]):
            ends = True  # a period after a word that is no abbreviation
        else:
            ends = _ends(text, text[p:m.start(1)].replace(" ", ""), m.group(1), p, q, lo, sent_start, nxt)
        lo = q
        if ends:
            yield text[sent_start:q]
            sent_start = q
    yield text[sent_start:]


def _drop_inline_marker(item: str) -> str:
    m = START_MARKER_RE.match(item)
    return item[m.end():] if m is not None else item


def split_sentences(text: str) -> List[str]:
    """Split a response into sentences (see docs/mmmt_if.md, "Sentences")."""
    return list(iter_sentences(text))


def iter_sentences(text: str) -> Iterator[str]:
    """The sentences of a response, one at a time (a checker may stop at the first that fails).

    Lines are first joined into blocks (a wrapped sentence is one sentence; list items,
    headings, titles and blank lines end one); blocks are cut at inline list markers;
    heading, quote, bullet and list markers are stripped; an end mark ends a sentence when
    its context says so (``_ends``). Pieces without any letter or digit are not sentences.
    """
    has_alnum = HAS_ALNUM_RE.search
    for block in blocks(str(text)):
        items = [block]
        cuts = list_cuts(block)
        if cuts:
            items = [block[:cuts[0]]] + [_drop_inline_marker(block[a:b])
                                         for a, b in zip(cuts, cuts[1:] + [len(block)])]
        for item in items:
            pending = ""
            for piece in _split_segment(strip_marker(item.strip())):
                piece = piece.strip()
                if pending:
                    piece = strip_marker(pending + piece)
                    pending = ""
                elif piece[:1] in MARKER_START:
                    if MARKER_ONLY_RE.match(piece):  # "2." before an inline list item
                        pending = piece + " "
                        continue
                    piece = strip_marker(piece)
                if piece and has_alnum(piece):
                    yield piece


def first_alnum(sentence: str) -> str:
    """The first letter or digit of a sentence (leading quotes, brackets and markup skipped)."""
    for ch in sentence:
        if ch.isalnum():
            return ch
    return ""


def last_mark(sentence: str) -> str:
    """The sentence's end mark: its last character before closing quotes, brackets, markup,
    emoji and footnote markers ("1937.[1]", "1937.¹" and "Done.\U0001F600" end with '.')."""
    s = sentence
    i = len(s)
    while i:
        c = s[i - 1]
        if c == "]":
            j = s.rfind("[", max(0, i - 6), i - 1)
            if j >= 0 and s[j + 1:i - 1].isdigit():
                i = j
                continue
        if c in CLOSERS or c in _SUPERSCRIPTS or c.isspace() or _IS_EMOJI(c):
            i -= 1
            continue
        return c
    return ""


#: an emoji closes a sentence as a quote does ("Is it done?\U0001F600" ends with '?')
_IS_EMOJI = re.compile("[" + EMOJI + "]").match
