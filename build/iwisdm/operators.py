"""iWISDM task operators, their connectivity rules and their backward/forward semantics.

Why operators are classes: each owns the three things that must stay consistent with one
another - the backward step (given the output it must produce, constrain its children),
the forward step (compute the output from the frames) and its instruction fragment. A new
operator is one subclass decorated with ``@register_operator`` plus one ``CONNECTIVITY`` entry.
"""
from __future__ import annotations

import logging
import random
from typing import Any, Callable, ClassVar, Dict, List, Optional, Sequence, Tuple, Type

logger = logging.getLogger(__name__)

BOOL = "bool"
ATTRS = ("location", "category", "identity")
#: attributes a CONST may hold (identities have no name an instruction could use)
CONST_ATTRS = ("location", "category")

OPERATORS: Dict[str, Type["Operator"]] = {}

#: Connectivity rules: for each operator, the operator names allowed in each child slot.
#: AutoTask samples only graphs that satisfy them and task files are validated against them.
CONNECTIVITY: Dict[str, Dict[str, Any]] = {
    "Select": {"children": []},
    "CONST": {"children": []},
    "GetCategory": {"children": [["Select"]]},
    "GetLocation": {"children": [["Select"]]},
    "GetIdentity": {"children": [["Select"]]},
    # a constant may stand on either side ("couches not equals category of object 1"), as in the
    # original; never on both (checked in graph._check_node)
    "IsSame": {"children": [["GetCategory", "GetLocation", "GetIdentity", "CONST"]] * 2},
    "NotSame": {"children": [["GetCategory", "GetLocation", "GetIdentity", "CONST"]] * 2},
    "And": {"children": [["IsSame", "NotSame", "And", "Or", "Exist"]] * 2},
    "Or": {"children": [["IsSame", "NotSame", "And", "Or", "Exist"]] * 2},
    "Exist": {"children": [["Select"], ["CONST"]]},
    "Switch": {"children": [["IsSame", "NotSame", "And", "Or", "Exist"],
                            ["IsSame", "NotSame", "And", "Or", "Exist", "GetCategory", "GetLocation",
                             "Switch"],
                            ["IsSame", "NotSame", "And", "Or", "Exist", "GetCategory", "GetLocation",
                             "Switch"]]},
}


def register_operator(cls: Type["Operator"]) -> Type["Operator"]:
    """Class decorator: make an operator available by name (task files, AutoTask)."""
    OPERATORS[cls.name] = cls
    return cls


def min_depths(connectivity: Dict[str, Dict[str, Any]], allowed: Optional[Sequence[str]] = None) -> Dict[str, int]:
    """Shortest possible subtask depth of each operator (leaves: 0), by fixed-point iteration."""
    names = [n for n in connectivity if allowed is None or n in allowed]
    inf = 10 ** 6
    depth = {n: (0 if not connectivity[n]["children"] else inf) for n in names}
    for _ in range(len(names) + 1):
        for n in names:
            slots = connectivity[n]["children"]
            if not slots:
                continue
            best = 0
            for slot in slots:
                best = max(best, min((depth.get(c, inf) for c in slot), default=inf))
            if n in ("IsSame", "NotSame"):  # at least one side is not a constant
                best = max(best, min((depth.get(c, inf) for c in slots[0] if c != "CONST"), default=inf))
            depth[n] = min(depth[n], best + 1)
    return depth


# ---------------------------------------------------------------------------------------------
# Constraint collection (backward) and the trial context (forward)
# ---------------------------------------------------------------------------------------------
class Constraints:
    """Constraints on object attributes collected by the backward pass.

    Terms are variable keys ``(attr, kind, id)``: kind ``'o'`` an object (id = object number),
    ``'c'`` a free CONST node (id = node uid). Identity equality/inequality is kept separately
    because an identity is the pair (category, index within category).
    """

    __slots__ = ("eq", "ne", "pin", "pin_not", "id_eq", "id_ne")

    def __init__(self) -> None:
        self.eq: List[Tuple[tuple, tuple]] = []
        self.ne: List[Tuple[tuple, tuple]] = []
        self.pin: List[Tuple[tuple, Any]] = []
        self.pin_not: List[Tuple[tuple, Any]] = []
        self.id_eq: List[Tuple[int, int]] = []
        self.id_ne: List[Tuple[int, int]] = []


class Context:
    """What operators need during a pass: Select -> object number and the resolved values."""

    __slots__ = ("obj_of", "values", "objects", "rng", "cons", "answer_spaces", "picker")

    def __init__(self, obj_of: Dict[int, int], rng: random.Random, answer_spaces: Dict[str, Sequence[Any]],
                 picker: Optional[Callable[[str, Sequence[Any]], Any]] = None) -> None:
        self.obj_of = obj_of            # Select uid -> object number (1-based)
        self.values: Dict[tuple, Any] = {}  # solved variable values
        self.objects: Dict[int, Dict[str, Any]] = {}  # object number -> attributes
        self.rng = rng
        self.cons = Constraints()
        self.answer_spaces = answer_spaces
        #: draws a root answer value for a response type (default: uniform; presets use decks)
        self.picker = picker

    def pick(self, kind: str, space: Sequence[Any]) -> Any:
        if self.picker is not None:
            return self.picker(kind, space)
        return self.rng.choice(space)


# ---------------------------------------------------------------------------------------------
# Operators
# ---------------------------------------------------------------------------------------------
class Operator:
    """A node of a task graph. ``children`` are operators; ``uid`` is set by the Task."""

    name: ClassVar[str] = ""
    #: names of the parameters stored in task files
    param_names: ClassVar[Tuple[str, ...]] = ()
    #: the attribute a value node yields (Get's class attribute, CONST's parameter); declared
    #: here, unset, so that code holding a child as an Operator may read it
    attr: str

    def __init__(self, *children: "Operator", **params: Any) -> None:
        self.children: List[Operator] = list(children)
        self.uid: int = -1
        for k in self.param_names:
            setattr(self, k, params.pop(k, None))
        if params:
            raise TypeError(f"{self.name}: unknown parameters {sorted(params)}")

    def params(self) -> Dict[str, Any]:
        return {k: getattr(self, k) for k in self.param_names if getattr(self, k) is not None}

    # -- typing ---------------------------------------------------------------------------
    def out_type(self) -> str:
        raise NotImplementedError

    def answer_types(self) -> Tuple[str, ...]:
        """Response types this operator can produce as a task's answer."""
        return (self.out_type(),)

    # -- passes ---------------------------------------------------------------------------
    def sample_target(self, ctx: Context) -> Any:
        """A value drawn uniformly from the answer space (Switch draws its branch first)."""
        return ctx.pick(self.out_type(), ctx.answer_spaces[self.out_type()])

    def backward(self, target: Any, ctx: Context) -> None:
        """Constrain the children so that this node outputs ``target`` (None: unconstrained)."""
        for c in self.children:
            c.backward(None, ctx)

    def forward(self, ctx: Context) -> Any:
        raise NotImplementedError

    def phrase(self, ctx: Context, top: bool = False) -> str:
        raise NotImplementedError

    def term(self, ctx: Context) -> tuple:
        """The solver's key of the value this node yields (value nodes: Get, CONST)."""
        raise NotImplementedError(f"{self.name} yields no attribute value")


@register_operator
class Select(Operator):
    """Picks the object shown on one frame (``when``: frame index, None: placed per trial)."""

    name = "Select"
    param_names = ("when",)
    when: Optional[int]

    def out_type(self) -> str:
        return "object"

    def forward(self, ctx: Context) -> Dict[str, Any]:
        return ctx.objects[ctx.obj_of[self.uid]]

    def phrase(self, ctx: Context, top: bool = False) -> str:
        return f"object {ctx.obj_of[self.uid]}"


class Get(Operator):
    """Fetches one attribute of the selected object."""

    attr: str = ""

    def out_type(self) -> str:
        return self.attr

    def term(self, ctx: Context) -> tuple:
        return (self.attr, "o", ctx.obj_of[self.children[0].uid])

    def backward(self, target: Any, ctx: Context) -> None:
        if target is not None:
            if self.attr == "identity":
                raise ValueError("an identity cannot be a task answer")
            ctx.cons.pin.append((self.term(ctx), target))

    def forward(self, ctx: Context) -> Any:
        obj = self.children[0].forward(ctx)
        if self.attr == "identity":
            return (obj["category"], obj["identity"])
        return obj[self.attr]

    def phrase(self, ctx: Context, top: bool = False) -> str:
        return f"{self.attr} of {self.children[0].phrase(ctx)}"


@register_operator
class GetCategory(Get):
    name = "GetCategory"
    attr = "category"


@register_operator
class GetLocation(Get):
    name = "GetLocation"
    attr = "location"


@register_operator
class GetIdentity(Get):
    name = "GetIdentity"
    attr = "identity"


@register_operator
class CONST(Operator):
    """A fixed attribute value; ``value`` None means it is drawn per trial."""

    name = "CONST"
    param_names = ("attr", "value")
    value: Any

    def out_type(self) -> str:
        return self.attr

    def term(self, ctx: Context) -> tuple:
        # keyed by the node object, so CONSTs of composed tasks never collide
        return (self.attr, "c", id(self))

    def forward(self, ctx: Context) -> Any:
        return self.value if self.value is not None else ctx.values[self.term(ctx)]

    def backward(self, target: Any, ctx: Context) -> None:
        if self.value is not None:
            ctx.cons.pin.append((self.term(ctx), self.value))

    def phrase(self, ctx: Context, top: bool = False) -> str:
        return str(self.forward(ctx))


class Compare(Operator):
    """IsSame / NotSame: compares two attribute values of the same kind."""

    negate: ClassVar[bool] = False

    def out_type(self) -> str:
        return BOOL

    def backward(self, target: Any, ctx: Context) -> None:
        a, b = self.children
        for c in (a, b):
            c.backward(None, ctx)
        if target is None:
            return
        equal = bool(target) != self.negate
        if a.out_type() == "identity":
            pair = (ctx.obj_of[a.children[0].uid], ctx.obj_of[b.children[0].uid])
            (ctx.cons.id_eq if equal else ctx.cons.id_ne).append(pair)
        else:
            (ctx.cons.eq if equal else ctx.cons.ne).append((a.term(ctx), b.term(ctx)))

    def forward(self, ctx: Context) -> bool:
        same = self.children[0].forward(ctx) == self.children[1].forward(ctx)
        return same != self.negate

    def phrase(self, ctx: Context, top: bool = False) -> str:
        word = "not equals" if self.negate else "equals"
        return f"{self.children[0].phrase(ctx)} {word} {self.children[1].phrase(ctx)}"


@register_operator
class IsSame(Compare):
    name = "IsSame"


@register_operator
class NotSame(Compare):
    name = "NotSame"
    negate = True


class Logic(Operator):
    """And / Or over two booleans; nested And/Or children are parenthesised in instructions."""

    word: ClassVar[str] = ""
    #: child output pairs that produce each output value
    table: ClassVar[Dict[bool, Tuple[Tuple[bool, bool], ...]]] = {}

    def out_type(self) -> str:
        return BOOL

    def backward(self, target: Any, ctx: Context) -> None:
        if target is None:
            for c in self.children:
                c.backward(None, ctx)
            return
        pair = ctx.rng.choice(self.table[bool(target)])
        for c, t in zip(self.children, pair):
            c.backward(t, ctx)

    def phrase(self, ctx: Context, top: bool = False) -> str:
        parts = []
        for c in self.children:
            s = c.phrase(ctx)
            parts.append(f"({s})" if isinstance(c, Logic) else s)
        return f" {self.word} ".join(parts)


@register_operator
class And(Logic):
    name = "And"
    word = "and"
    table = {True: ((True, True),), False: ((False, False), (False, True), (True, False))}

    def forward(self, ctx: Context) -> bool:
        a = self.children[0].forward(ctx)
        b = self.children[1].forward(ctx)
        return bool(a and b)


@register_operator
class Or(Logic):
    name = "Or"
    word = "or"
    table = {True: ((True, True), (False, True), (True, False)), False: ((False, False),)}

    def forward(self, ctx: Context) -> bool:
        a = self.children[0].forward(ctx)
        b = self.children[1].forward(ctx)
        return bool(a or b)


@register_operator
class Exist(Operator):
    """Whether an object with the CONST's value is present on the selected object's frame."""

    name = "Exist"

    def out_type(self) -> str:
        return BOOL

    def backward(self, target: Any, ctx: Context) -> None:
        sel, const = self.children
        const.backward(None, ctx)
        if target is None:
            return
        term = (const.attr, "o", ctx.obj_of[sel.uid])
        (ctx.cons.eq if target else ctx.cons.ne).append((term, const.term(ctx)))

    def forward(self, ctx: Context) -> bool:
        obj = self.children[0].forward(ctx)
        const = self.children[1]
        value = const.forward(ctx)
        frame = ctx.values.get(("frame_objects", ctx.obj_of[self.children[0].uid]), [obj])
        return any(o[const.attr] == value for o in frame)

    def phrase(self, ctx: Context, top: bool = False) -> str:
        return f"exists {self.children[1].phrase(ctx)} in frame of {self.children[0].phrase(ctx)}"


@register_operator
class Switch(Operator):
    """if <condition>, then <branch> else <branch>: the condition picks which subtask answers."""

    name = "Switch"

    def out_type(self) -> str:
        types = set(self.answer_types())
        return types.pop() if len(types) == 1 else "mixed"

    def answer_types(self) -> Tuple[str, ...]:
        out: List[str] = []
        for c in self.children[1:]:
            for t in c.answer_types():
                if t not in out:
                    out.append(t)
        return tuple(out)

    def sample_target(self, ctx: Context) -> Any:
        cond = ctx.pick("switch_condition", (True, False))
        branch = self.children[1] if cond else self.children[2]
        return ("switch", cond, branch.sample_target(ctx))

    def backward(self, target: Any, ctx: Context) -> None:
        if target is None:
            for c in self.children:
                c.backward(None, ctx)
            return
        _, cond, sub = target
        self.children[0].backward(cond, ctx)
        active, inactive = (self.children[1], self.children[2]) if cond else (self.children[2], self.children[1])
        active.backward(sub, ctx)
        inactive.backward(None, ctx)

    def forward(self, ctx: Context) -> Any:
        cond = self.children[0].forward(ctx)
        return (self.children[1] if cond else self.children[2]).forward(ctx)

    def phrase(self, ctx: Context, top: bool = False) -> str:
        cond = self.children[0].phrase(ctx)
        branches = []
        for c in self.children[1:]:
            s = c.phrase(ctx)
            branches.append(f"({s})" if isinstance(c, Switch) else s)
        if top:
            return f"if {cond}, then {branches[0]}? else {branches[1]}?"
        return f"if {cond}, then {branches[0]} else {branches[1]}"


def unwrap_target(target: Any) -> Any:
    """The answer value inside a (possibly nested) Switch target."""
    while isinstance(target, tuple) and len(target) == 3 and target[0] == "switch":
        target = target[2]
    return target


def answer_word(value: Any) -> str:
    """How an answer value is written: booleans as true/false, others as their name."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def walk(root: Operator) -> List[Operator]:
    """Unique nodes reachable from ``root`` (parents before children, first-visit order)."""
    seen: Dict[int, Operator] = {}
    stack = [root]
    order: List[Operator] = []
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen[id(node)] = node
        order.append(node)
        stack.extend(reversed(node.children))
    return order


OpFactory = Callable[..., Operator]
