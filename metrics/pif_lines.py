"""Lines, blocks and list markers of a model response: the layout a reader sees first.

Why apart from the sentence rules: a line break, a bullet or a numbered marker ends or
starts a sentence by its place in the layout, before any punctuation is read. Both passes
here are linear in the text. Used by metrics/pif_sentences.py; the rules are written out
in docs/mmmt_if.md ("Sentences", rules 1-3).
"""
from __future__ import annotations

import re
from typing import Dict, Iterator, List, Tuple

#: closing quotes, brackets and markup; bullets; end marks (shared with the sentence rules)
CLOSERS = "\"'”’»)]}*_`~"
BULLETS = "•⁃‣◦▪"
END_CHARS = ".!?…"

# ---------------------------------------------------------------------------------------
# Line structure: markers, items, titles, blocks
# ---------------------------------------------------------------------------------------

_LINE_MARKER_RE = re.compile(r"^(?:#{1,6}\s+|>\s*|[-*+–]\s+|[•⁃‣◦▪]\s*|\(?\d{1,3}(?:\.\)|[.)])\s+)+")
MARKER_ONLY_RE = re.compile(r"^[\s*_#>\-+•–⁃‣◦▪]*\(?\d{1,3}(?:\.\)|[.)])[\s*_]*$")
MARKER_START = frozenset("#>-*+•–⁃‣◦▪(0123456789")
HAS_ALNUM_RE = re.compile(r"[^\W_]")
#: a line that is a title by itself: wholly bold/italic (optionally ending with ':')
_EMPHASIS_LINE_RE = re.compile(r"^([*_]{1,3})[^*_].*\1:?$")
#: a horizontal rule ('---', '***', '___')
_RULE_RE = re.compile(r"[-*_=~\s]{3,}")
#: lower-case words allowed inside a title line ("Overview of the Scene")
_TITLE_SMALL = frozenset("a an the of and or in on at to for with by from vs".split())


def strip_marker(sentence: str) -> str:
    """The sentence without its leading heading, quote, bullet or numbered-list markers."""
    if sentence[:1] not in MARKER_START:
        return sentence
    m = _LINE_MARKER_RE.match(sentence)
    return sentence[m.end():] if m is not None else sentence


def _is_item(line: str) -> bool:
    """A line that starts a block of its own: list item, heading, quote, table row."""
    c = line[0]
    if c == "|" or (c in MARKER_START and _LINE_MARKER_RE.match(line) is not None):
        return True
    return c in "-*_=~" and _RULE_RE.fullmatch(line) is not None


def _is_title(line: str) -> bool:
    """A short Title Case line without closing punctuation ("Key Features"): a heading."""
    if line[-1] in ".!?…,;" or not line[:1].isupper():
        return False
    words = line.split(None, 6)
    if len(words) > 6:
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


def blocks(text: str) -> Iterator[str]:
    """Lines joined into blocks: blank lines and sentence-ending line breaks separate them."""
    cur: List[str] = []
    prev = ""
    prev_item = False
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            if cur:
                yield " ".join(cur)
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
            yield " ".join(cur)
            cur = []
        if not cur:
            prev_item = item
        cur.append(line)
        prev = line
    if cur:
        yield " ".join(cur)

# ---------------------------------------------------------------------------------------
# Inline list markers ("1.) a 2.) b", "a. x b. y", "• 9. x • 10. y")
# ---------------------------------------------------------------------------------------


#: the '.' or ')' that may end a list marker, before whitespace and after a digit, an ASCII
#: letter or '.'; a word's end (two letters before it) is ruled out here, so the scan stays in C
_MARKER_END_RE = re.compile(r"[.)](?=\s)(?<=[0-9A-Za-z.][.)])(?<![^\W\d_]{2}[.)])")
#: a list marker at the start of an item: optional bullet, 1-3 digits or one letter, '.', ')' or '.)'
START_MARKER_RE = re.compile(r"([•⁃‣◦▪]\s*)?\(?(\d{1,3}|[A-Za-z])(\.\)|\.|\))(?=\s)")
_ASCII_LETTERS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


def _markers(block: str) -> List[Tuple[int, bool, str, str]]:
    """(start, after a bullet, label, style) of each list marker in the block, in order."""
    out: List[Tuple[int, bool, str, str]] = []
    for m in _MARKER_END_RE.finditer(block):
        e = m.start()
        style, end = ".", e
        if block[e] == ")":
            style = ".)" if e and block[e - 1] == "." else ")"
            end = e - 1 if style == ".)" else e
        j = end
        while j > 0 and end - j < 3 and block[j - 1].isdigit():
            j -= 1
        if j == end:
            if not (j > 0 and block[j - 1] in _ASCII_LETTERS):
                continue
            j -= 1
        label = block[j:end]
        if j and block[j - 1] == "(":
            j -= 1
        if j and not block[j - 1].isspace():
            if block[j - 1] not in BULLETS:
                continue
            out.append((j - 1, True, label, style))
            continue
        k = j - 1
        while k >= 0 and k > j - 4 and block[k] in " \t":
            k -= 1
        if k >= 0 and block[k] in BULLETS and (k == 0 or block[k - 1].isspace()):
            out.append((k, True, label, style))
        else:
            out.append((j, False, label, style))
    return out


def list_cuts(block: str) -> List[int]:
    """Where inline list items start: the positions of the markers that form a list.

    A marker belongs to a list when it follows a bullet (•, ⁃), or when it continues a
    chain of markers of one kind (digits, lower-case or upper-case letters) and style ('.',
    ')', '.)') numbered 1, 2, 3... whose first marker opens the block or follows ':' or an
    end mark. A chain of letters needs two markers ("A. Smith" is a name); a chain of
    digits may be one marker after ':' ("Differences: 1. **Body**").
    """
    cuts: List[int] = []
    chains: Dict[Tuple[str, str], List[int]] = {}  # (kind, style) -> [next value, *starts]
    for at, bullet, label, style in _markers(block):
        if bullet:
            cuts.append(at)
            continue
        kind = "d" if label.isdigit() else ("l" if label.islower() else "u")
        value = int(label) if kind == "d" else ord(label.lower()) - 96
        key = (kind, style)
        chain = chains.get(key)
        if chain is not None and value == chain[0]:
            chain[0] += 1
            chain.append(at)
            if len(chain) == 3:  # the chain is a list from its second marker on
                cuts.append(chain[1])
            cuts.append(at)
            continue
        if value == 1:
            k = at - 1
            while k >= 0 and block[k] in " \t":
                k -= 1
            before = block[k] if k >= 0 else ""
            if before in ("", ":") or before in END_CHARS or (before in CLOSERS and at > 1):
                chains[key] = [2, at]
                if kind == "d" and before in ("", ":"):
                    cuts.append(at)
    return sorted(set(cuts))
