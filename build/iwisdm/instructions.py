"""Parser and evaluator for iWISDM instructions (grammar: docs/iwisdm.md).

Why: the generator's answers must be checkable independently of the generator. The parser
reads only the instruction text and the per-frame object metadata, so a test that agrees
with every stored answer shows both that the instruction has one reading and that the answer
follows from the frames.
"""
from __future__ import annotations

import logging
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .stimuli import DEFAULT_CATEGORIES, LOCATIONS
from ...utils.errors import ReformError

logger = logging.getLogger(__name__)

ATTR_WORDS = ("location", "category", "identity")
#: most operands of an unparenthesised and/or chain (the original's text) the parser evaluates
MAX_CHAIN = 8


class InstructionError(ReformError):
    """The instruction does not match the grammar or refers to missing objects."""


class InstructionParser:
    """Recursive-descent parser; ``evaluate`` returns the answer word of every question."""

    def __init__(self, categories: Sequence[str] = DEFAULT_CATEGORIES) -> None:
        self.values = sorted(list(LOCATIONS) + list(categories), key=len, reverse=True)
        self.locations = set(LOCATIONS)

    # -- low-level helpers -------------------------------------------------------------------
    def _fail(self, msg: str) -> InstructionError:
        return InstructionError(f"instruction parse error at char {self.pos}: {msg}: "
                                f"...{self.text[self.pos:self.pos + 40]!r}")

    def _peek(self, s: str) -> bool:
        return self.text.startswith(s, self.pos)

    def _eat(self, s: str) -> None:
        if not self.text.startswith(s, self.pos):
            raise self._fail(f"expected {s!r}")
        self.pos += len(s)

    def _int(self) -> int:
        start = self.pos
        while self.pos < len(self.text) and self.text[self.pos].isdigit():
            self.pos += 1
        if start == self.pos:
            raise self._fail("expected a number")
        return int(self.text[start:self.pos])

    def _value(self) -> str:
        for v in self.values:
            if self.text.startswith(v, self.pos):
                self.pos += len(v)
                return v
        raise self._fail("expected a location or category")

    def _attr(self) -> str:
        for a in ATTR_WORDS:
            if self._peek(a + " of object "):
                self.pos += len(a)
                return a
        raise self._fail("expected 'location|category|identity of object'")

    # -- grammar ---------------------------------------------------------------------------
    def parse(self, text: str) -> List[Tuple[Any, ...]]:
        """The instruction as a list of items: ('observe', k, qualifiers) | ('delay',) | ('question', ast)."""
        self.text, self.pos = text, 0
        items: List[Tuple[Any, ...]] = []
        while True:
            if self._peek("observe object "):
                self.pos += len("observe object ")
                k = self._int()
                quals = []
                # targets among distractors: ours "with location: top left" / "with category: cars",
                # the original's "at location: top left" (possibly after a "with ..." qualifier)
                while self._peek(" with ") or self._peek(" at "):
                    self.pos += len(" with ") if self._peek(" with ") else len(" at ")
                    attr = next((a for a in ("location", "category") if self._peek(a + ": ")), None)
                    if attr is None:
                        raise self._fail("expected 'location: ' or 'category: '")
                    self.pos += len(attr) + 2
                    quals.append((attr, self._value()))
                items.append(("observe", k, tuple(quals) or None))
            elif self._peek("delay"):
                self.pos += len("delay")
                items.append(("delay",))
            else:
                items.append(("question", self._question()))
            if self.pos == len(self.text):
                return items
            self._eat(", ")

    def _question(self) -> Any:
        if self._peek("if "):
            return self._switch(top=True)
        e = self._expr()
        self._eat("?")
        return e

    def _switch(self, top: bool) -> Any:
        self._eat("if ")
        cond = self._boolean()
        self._eat(", then ")
        a = self._branch()
        self._eat("? else " if top else " else ")
        b = self._branch()
        if top:
            self._eat("?")
        return ("switch", cond, a, b)

    def _branch(self) -> Any:
        if self._peek("(if "):
            self._eat("(")
            s = self._switch(top=False)
            self._eat(")")
            return s
        return self._expr()

    def _expr(self) -> Any:
        """A boolean expression or a bare getter (a Get root or Switch branch)."""
        if any(self._peek(a + " of object ") for a in ATTR_WORDS):
            save = self.pos
            g = self._getter()
            if not (self._peek(" equals ") or self._peek(" not equals ")):
                return g
            self.pos = save
        return self._boolean()

    def _boolean(self) -> Any:
        """Operands joined by and/or. Ours parenthesise nesting, so a chain of more than two
        operands comes from the original's unparenthesised text ("A and B or C"); it is read as
        ('chain', operands, words) and evaluated over every bracketing (see ``_chain``)."""
        operands, words = [self._operand()], []
        while True:
            word = next((w for w in ("and", "or") if self._peek(f" {w} ")), None)
            if word is None:
                break
            self.pos += len(word) + 2
            words.append(word)
            operands.append(self._operand())
        if not words:
            return operands[0]
        if len(words) == 1:
            return (words[0], operands[0], operands[1])
        if len(operands) > MAX_CHAIN:
            raise self._fail(f"more than {MAX_CHAIN} operands joined by and/or without parentheses")
        return ("chain", operands, words)

    def _operand(self) -> Any:
        if self._peek("("):
            self._eat("(")
            node = self._boolean()
            if node[0] not in ("and", "or", "chain"):
                raise self._fail("expected ' and ' or ' or ' inside parentheses")
            self._eat(")")
            return node
        if self._peek("exists "):
            self.pos += len("exists ")
            v = self._value()
            self._eat(" in frame of object ")
            return ("exists", v, self._int())
        if any(self._peek(a + " of object ") for a in ATTR_WORDS):
            lhs = self._getter()
        else:  # a constant first, as the original writes it: "couches not equals category of object 1"
            lhs = ("const", self._value())
        if self._peek(" not equals "):
            self.pos += len(" not equals ")
            neg = True
        else:
            self._eat(" equals ")
            neg = False
        if any(self._peek(a + " of object ") for a in ATTR_WORDS):
            rhs = self._getter()
        elif lhs[0] == "const":
            raise self._fail("a comparison of two constants")
        else:
            rhs = ("const", self._value())
        return ("ne" if neg else "eq", lhs, rhs)

    def _getter(self) -> Any:
        attr = self._attr()
        self._eat(" of object ")
        return ("get", attr, self._int())

    # -- evaluation ------------------------------------------------------------------------
    def evaluate(self, text: str, frames: Sequence[Sequence[Dict[str, Any]]]) -> List[str]:
        """Answer words of every question, computed from the frames' object metadata."""
        items = self.parse(text)
        where: Dict[int, Tuple[int, Optional[Tuple[Tuple[str, str], ...]]]] = {}
        fi = 0
        answers: List[str] = []
        steps = [it[0] for it in items if it[0] != "question"]
        si = 0
        for it in items:
            if it[0] in ("observe", "delay"):
                if fi >= len(frames):
                    raise InstructionError(f"instruction names more frames than the trial has ({len(frames)})")
                si += 1
                if it[0] == "observe":
                    if it[1] in where:
                        raise InstructionError(f"object {it[1]} observed twice")
                    if not frames[fi]:
                        raise InstructionError(f"object {it[1]} is observed on frame {fi}, which is blank")
                    where[it[1]] = (fi, it[2])
                    fi += 1
                    continue
                # "delay" is one blank frame, or a run of them: the last "delay" before the next
                # observation (questions between do not count) takes the rest of the run
                if frames[fi]:
                    raise InstructionError(f"'delay' on frame {fi}, which shows an object")
                fi += 1
                if si >= len(steps) or steps[si] != "delay":
                    while fi < len(frames) and not frames[fi]:
                        fi += 1
            else:
                v = self._eval(it[1], frames, where)
                answers.append(("true" if v else "false") if isinstance(v, bool) else str(v))
        if fi != len(frames):
            raise InstructionError(f"instruction names {fi} frames, the trial has {len(frames)}")
        return answers

    def _obj(self, k: int, frames: Sequence[Sequence[Dict[str, Any]]], where: Dict) -> Dict[str, Any]:
        if k not in where:
            raise InstructionError(f"object {k} is used before it is observed")
        fi, quals = where[k]
        objs = list(frames[fi])
        for attr, value in quals or ():
            objs = [o for o in objs if o[attr] == value]
        if len(objs) != 1:
            raise InstructionError(f"object {k} is ambiguous: {len(objs)} candidates on frame {fi}")
        return objs[0]

    def _eval(self, node: Any, frames: Sequence, where: Dict) -> Any:
        op = node[0]
        if op == "get":
            o = self._obj(node[2], frames, where)
            return (o["category"], o["identity"]) if node[1] == "identity" else o[node[1]]
        if op == "const":
            return node[1]
        if op in ("eq", "ne"):
            same = self._eval(node[1], frames, where) == self._eval(node[2], frames, where)
            return same if op == "eq" else not same
        if op == "and":
            return bool(self._eval(node[1], frames, where)) and bool(self._eval(node[2], frames, where))
        if op == "or":
            return bool(self._eval(node[1], frames, where)) or bool(self._eval(node[2], frames, where))
        if op == "chain":
            return self._chain(node, frames, where)
        if op == "exists":
            attr = "location" if node[1] in self.locations else "category"
            self._obj(node[2], frames, where)
            fi = where[node[2]][0]
            return any(o[attr] == node[1] for o in frames[fi])
        if op == "switch":
            return self._eval(node[2] if self._eval(node[1], frames, where) else node[3], frames, where)
        raise InstructionError(f"unknown node {op}")


    def _chain(self, node: Any, frames: Sequence, where: Dict) -> bool:
        """An unparenthesised and/or chain: its value if every bracketing gives the same one
        (always so when all words are equal), else an error naming the ambiguity."""
        _, operands, words = node
        vals = [bool(self._eval(o, frames, where)) for o in operands]
        memo: Dict[Tuple[int, int], set] = {}

        def results(i: int, j: int) -> set:
            if i == j:
                return {vals[i]}
            if (i, j) not in memo:
                out = set()
                for k in range(i, j):
                    for a in results(i, k):
                        for b in results(k + 1, j):
                            out.add((a and b) if words[k] == "and" else (a or b))
                memo[(i, j)] = out
            return memo[(i, j)]
        got = results(0, len(vals) - 1)
        if len(got) != 1:
            raise InstructionError(f"'{' ... '.join(words)}' chain without parentheses is ambiguous here: "
                                   "its bracketings give different answers")
        return got.pop()


def evaluate_instruction(text: str, frames: Sequence[Sequence[Dict[str, Any]]],
                         categories: Sequence[str] = DEFAULT_CATEGORIES) -> str:
    """The final answer word an instruction asks for, from the frame metadata alone."""
    answers = InstructionParser(categories).evaluate(text, frames)
    if not answers:
        raise InstructionError("instruction contains no question")
    return answers[-1]
