"""Task graphs: user-specified (networkx / JSON task files), classic tasks, and AutoTask.

Why a thin Task wrapper around the operator tree: trial instantiation walks Python objects
(fast), while users and files exchange networkx DiGraphs or JSON; both views convert exactly.
"""
from __future__ import annotations

import json
import logging
import random
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Tuple

from .operators import (CONNECTIVITY, CONST, CONST_ATTRS, OPERATORS, Get, GetCategory, GetIdentity,
                                    GetLocation, IsSame, NotSame, Operator, Select, Switch, min_depths, walk)
from ...utils.errors import ReformError, input_error
from ...utils.inputs import check_value, parse_json, read_json

if TYPE_CHECKING:
    import networkx as nx

logger = logging.getLogger(__name__)

TASK_FORMAT = "iwisdm-task/1"
GETTERS = {"category": GetCategory, "location": GetLocation, "identity": GetIdentity}


class Task:
    """A task graph: its root operator plus, for hand-made tasks, the frame count.

    Selects either all carry ``when`` (frame index; negative counts from the end) and the task
    carries ``n_frames``, or none does and frames are laid out per trial.
    """

    def __init__(self, root: Operator, n_frames: Optional[int] = None, name: str = "") -> None:
        self.root = root
        self.n_frames = n_frames
        self.name = name
        self.nodes: List[Operator] = walk(root)
        for i, n in enumerate(self.nodes):
            n.uid = i
        self.selects: List[Select] = [n for n in self.nodes if isinstance(n, Select)]
        whens = [s.when for s in self.selects]
        self.explicit = any(w is not None for w in whens)
        self.counts: Dict[str, int] = {}
        for n in self.nodes:
            self.counts[n.name] = self.counts.get(n.name, 0) + 1
        self.features = sorted({n.attr for n in self.nodes if isinstance(n, Get)})
        #: selects that must not share an object (the two sides of one comparison)
        self.siblings: Dict[int, set] = {s.uid: set() for s in self.selects}
        for n in self.nodes:
            if isinstance(n, (IsSame, NotSame)):
                sel = [c.children[0].uid for c in n.children if isinstance(c, Get)]
                if len(sel) == 2:
                    self.siblings[sel[0]].add(sel[1])
                    self.siblings[sel[1]].add(sel[0])

    # -- views ----------------------------------------------------------------------------
    def to_dict(self) -> Dict[str, Any]:
        nodes = [{"id": n.uid, "op": n.name, **n.params()} for n in self.nodes]
        edges = [[n.uid, c.uid] for n in self.nodes for c in n.children]
        out: Dict[str, Any] = {"format": TASK_FORMAT, "name": self.name, "n_frames": self.n_frames,
                               "root": self.root.uid, "nodes": nodes, "edges": edges}
        return out

    def to_json(self, path: Optional[str] = None) -> str:
        text = json.dumps(self.to_dict(), indent=1, sort_keys=True)
        if path:
            with open(path, "w", encoding="utf-8") as f:
                f.write(text + "\n")
        return text

    def to_networkx(self) -> nx.DiGraph:
        """The task as a ``networkx.DiGraph`` (networkx is imported here: 150 ms that only a
        caller asking for a graph pays)."""
        import networkx as nx

        g: nx.DiGraph = nx.DiGraph(name=self.name, n_frames=self.n_frames)
        for n in self.nodes:
            g.add_node(n.uid, op=n.name, **n.params())
        for n in self.nodes:
            for slot, c in enumerate(n.children):
                g.add_edge(n.uid, c.uid, slot=slot)
        return g

    @property
    def n_bool_ops(self) -> int:
        return self.counts.get("And", 0) + self.counts.get("Or", 0)

    @property
    def n_switch(self) -> int:
        return self.counts.get("Switch", 0)

    def __repr__(self) -> str:
        return f"Task({self.name or 'unnamed'}, ops={self.counts})"


# ---------------------------------------------------------------------------------------------
# Loading and validation
# ---------------------------------------------------------------------------------------------
def _check_node(op: Operator, children: Sequence[Operator], where: str, nid: Any,
                connectivity: Dict[str, Dict[str, Any]]) -> None:
    slots = connectivity[op.name]["children"]
    if len(children) != len(slots):
        raise input_error(f"{op.name} needs {len(slots)} children, has {len(children)}",
                          file=where, record=f"node {nid}", field="edges")
    for k, (c, allowed) in enumerate(zip(children, slots)):
        if c.name not in allowed:
            raise input_error(f"{op.name} child {k} may be one of {', '.join(allowed)}, not {c.name} "
                              "(connectivity rules)", file=where, record=f"node {nid}", field="edges")
    if op.name in ("IsSame", "NotSame"):
        a, b = children
        if a.out_type() != b.out_type():
            raise input_error(f"{op.name} compares {a.out_type()} with {b.out_type()}",
                              file=where, record=f"node {nid}", field="edges")
        if a.name == "CONST" and b.name == "CONST":
            raise input_error(f"{op.name} compares two constants (its answer would not depend on the frames)",
                              file=where, record=f"node {nid}", field="edges")
    if op.name == "CONST":
        if op.attr not in CONST_ATTRS:
            raise input_error(f"CONST attr must be one of {', '.join(CONST_ATTRS)}, got {op.attr!r}",
                              file=where, record=f"node {nid}", field="attr")


def from_graph(nodes: Dict[Any, Dict[str, Any]], edges: List[Tuple[Any, Any]], root: Any = None,
               n_frames: Optional[int] = None, name: str = "", where: str = "<graph>",
               connectivity: Optional[Dict[str, Dict[str, Any]]] = None) -> Task:
    """Build a Task from node attribute dicts and ordered (parent, child) edges, validating it."""
    connectivity = connectivity or CONNECTIVITY
    children: Dict[Any, List[Any]] = {k: [] for k in nodes}
    parents: Dict[Any, int] = {k: 0 for k in nodes}
    for e in edges:
        p, c = e[0], e[1]
        if p not in nodes or c not in nodes:
            raise input_error(f"edge {p}->{c} names an unknown node", file=where, field="edges")
        children[p].append(c)
        parents[c] += 1
    roots = [k for k, v in parents.items() if v == 0]
    if root is None:
        if len(roots) != 1:
            raise input_error(f"a task graph needs exactly one root, found {len(roots)}", file=where, field="root")
        root = roots[0]
    elif root not in nodes or parents[root]:
        raise input_error(f"root {root!r} is not a node without parents", file=where, field="root")
    elif len(roots) != 1:
        raise input_error(f"nodes {sorted(map(str, roots))} are unreachable from the root", file=where, field="edges")
    built: Dict[Any, Operator] = {}
    state: Dict[Any, int] = {}

    def make(k: Any) -> Operator:
        if k in built:
            return built[k]
        if state.get(k) == 1:
            raise input_error(f"cycle through node {k}", file=where, field="edges")
        state[k] = 1
        spec = dict(nodes[k])
        opname = spec.pop("op", None)
        if opname not in OPERATORS or opname not in connectivity:
            raise input_error(f"unknown operator {opname!r}; valid: {', '.join(sorted(connectivity))}",
                              file=where, record=f"node {k}", field="op")
        kids = [make(c) for c in children[k]]
        cls = OPERATORS[opname]
        try:
            op = cls(*kids, **{p: v for p, v in spec.items() if p != "id"})
        except TypeError as e:
            raise input_error(str(e), file=where, record=f"node {k}", field="op") from None
        _check_node(op, kids, where, k, connectivity)
        built[k] = op
        state[k] = 2
        return op

    task = Task(make(root), n_frames=n_frames, name=name)
    validate_task(task, where)
    return task


def validate_task(task: Task, where: str = "<task>") -> None:
    """Frame-level checks: whens all-or-none, inside n_frames, comparisons of distinct objects."""
    whens = [s.when for s in task.selects]
    if task.explicit:
        if any(w is None for w in whens):
            raise input_error("either every Select has 'when' or none does", file=where, field="when")
        if task.n_frames is None:
            raise input_error("a task whose Selects have 'when' needs 'n_frames'", file=where, field="n_frames")
        for s in task.selects:
            if not isinstance(s.when, int) or not -task.n_frames <= s.when < task.n_frames:
                raise input_error(f"Select when={s.when!r} outside 0..{task.n_frames - 1}", file=where,
                                  record=f"node {s.uid}", field="when")
    if task.n_frames is not None and (not isinstance(task.n_frames, int) or task.n_frames < 1):
        raise input_error(f"n_frames must be a positive integer, got {task.n_frames!r}", file=where, field="n_frames")
    if task.root.name in ("Select", "CONST", "GetIdentity"):
        raise input_error(f"{task.root.name} cannot be a task's root (its output is no answer)",
                          file=where, field="root")


def load_task(source: Any, where: Optional[str] = None,
              connectivity: Optional[Dict[str, Dict[str, Any]]] = None) -> Task:
    """A Task from a JSON task file path, a task dict, a JSON string or a networkx DiGraph."""
    if isinstance(source, Task):
        return source
    # a DiGraph exists only where networkx was imported (it is not imported here: every start of
    # run_eval would pay its 150 ms)
    nx_module = sys.modules.get("networkx")
    if nx_module is not None and isinstance(source, nx_module.DiGraph):
        nodes = {k: dict(v) for k, v in source.nodes(data=True)}
        edges = sorted(source.edges(data=True), key=lambda e: (str(e[0]), e[2].get("slot", 0)))
        return from_graph(nodes, [(p, c) for p, c, _ in edges], n_frames=source.graph.get("n_frames"),
                          name=source.graph.get("name", ""), where=where or "<networkx graph>",
                          connectivity=connectivity)
    if isinstance(source, str) and not source.lstrip().startswith("{"):
        where = where or source
        data = read_json(source, "task file")
    elif isinstance(source, str):
        data = parse_json(source, "<task JSON>")
        check_value(data, "<task JSON>")
    else:
        data = source
    where = where or "<task dict>"
    if not isinstance(data, dict) or "nodes" not in data or "edges" not in data:
        raise input_error("a task file needs 'nodes' and 'edges'", file=where, field="nodes")
    nodes = {}
    for i, n in enumerate(data["nodes"]):
        if not isinstance(n, dict) or "id" not in n:
            raise input_error("each node needs an 'id'", file=where, record=f"node #{i}", field="id")
        nodes[n["id"]] = n
    return from_graph(nodes, [tuple(e) for e in data["edges"]], root=data.get("root"),
                      n_frames=data.get("n_frames"), name=data.get("name", ""), where=where,
                      connectivity=connectivity)


# ---------------------------------------------------------------------------------------------
# Classic tasks
# ---------------------------------------------------------------------------------------------
def dms(feature: str = "category", n_delay: int = 1) -> Task:
    """Delayed match to sample: is the <feature> of the last object the same as the first's?"""
    get = GETTERS[feature]
    n = n_delay + 2
    return Task(IsSame(get(Select(when=0)), get(Select(when=n - 1))), n_frames=n,
                name=f"dms_{feature}_d{n_delay}")


def two_back(feature: str = "category", n_objects: int = 4) -> List[Task]:
    """2-back as a temporal composition: at every object from the third, compare with 2 back."""
    get = GETTERS[feature]
    return [Task(IsSame(get(Select(when=t)), get(Select(when=t - 2))), n_frames=t + 1, name=f"2back_{feature}_{t}")
            for t in range(2, n_objects)]


def ctx_dm(feature: str = "category") -> Task:
    """Contextual decision making: if obj1 ~ obj3, compare obj2 with obj3, else obj2 with obj4."""
    get = GETTERS[feature]
    s = [Select(when=i) for i in range(4)]
    root = Switch(IsSame(get(s[0]), get(s[2])), IsSame(get(s[1]), get(s[2])), IsSame(get(s[1]), get(s[3])))
    return Task(root, n_frames=4, name=f"ctxdm_{feature}")


CLASSIC_TASKS = {"dms": dms, "ctxdm": ctx_dm}


# ---------------------------------------------------------------------------------------------
# AutoTask
# ---------------------------------------------------------------------------------------------
STYLES = ("subtasks", "recursive")


@dataclass
class TaskSpace:
    """The hyperparameters AutoTask samples from (paper section 3.1.1).

    ``style`` ``"subtasks"`` samples as iwisdm 0.1.3's AutoTask does under the upstream benchmark
    configs: each subtask is a root operator (from ``root_ops``, or ``branch_ops`` when Switches
    compose it) over comparisons, a Switch joins a new subtask and a conditional subtask (roots from
    ``cond_ops``) to the task so far, And/Or never nest. ``"recursive"`` grows one graph operator
    by operator within ``max_depth``/``max_op`` (And/Or may nest: "(A and B) or C").
    """

    min_switch: int = 0
    max_switch: int = 0
    max_depth: int = 5
    max_op: int = 20
    ops: Tuple[str, ...] = ("IsSame", "NotSame", "And", "Or", "GetCategory", "GetLocation", "GetIdentity",
                            "Select", "CONST", "Switch")
    root_ops: Tuple[str, ...] = ("IsSame", "NotSame", "And", "Or")
    #: operators a Switch branch may be (defaults to root_ops)
    branch_ops: Optional[Tuple[str, ...]] = None
    connectivity: Dict[str, Dict[str, Any]] = field(default_factory=lambda: CONNECTIVITY)
    #: probability that a comparison of locations or categories compares with a constant
    const_prob: float = 0.25
    #: probability that the constant is the first operand (the original draws the side uniformly: 0.5)
    const_first_prob: float = 0.0
    #: accepted number of And/Or operators (inclusive); None: any
    bool_ops: Optional[Tuple[int, int]] = None
    max_selects: Optional[int] = None
    style: str = "recursive"
    #: roots of a Switch condition (style "subtasks"; the original's ``boolean_ops``)
    cond_ops: Tuple[str, ...] = ("IsSame", "NotSame", "And", "Or")


class AutoTask:
    """Samples random task graphs that obey the connectivity rules of a TaskSpace."""

    MAX_TRIES = 2000

    def __init__(self, space: TaskSpace) -> None:
        self.space = space
        conn = space.connectivity
        for name in space.ops:
            if name not in conn or name not in OPERATORS:
                raise ReformError(f"AutoTask: operator '{name}' has no connectivity rule or class")
        if space.style not in STYLES:
            raise ReformError(f"AutoTask: unknown style '{space.style}'; valid: {', '.join(STYLES)}")
        self.depth = min_depths(conn, space.ops)
        self._cands: Dict[Tuple[Tuple[str, ...], int], List[str]] = {}
        self._max_bool = space.bool_ops[1] if space.bool_ops is not None else 10 ** 6
        self._getters = [g for g in ("GetCategory", "GetLocation", "GetIdentity") if g in space.ops]
        self._cmps = [c for c in ("IsSame", "NotSame") if c in space.ops]
        pools = {"root": space.root_ops, "branch": space.branch_ops or space.root_ops, "cond": space.cond_ops}
        self._pools = {k: tuple(o for o in v if o in space.ops) for k, v in pools.items()}

    def _choose(self, allowed: Sequence[str], depth_left: int, rng: random.Random) -> str:
        key = (tuple(allowed), depth_left)
        cands = self._cands.get(key)
        if cands is None:
            cands = [c for c in allowed if c in self.space.ops and c != "Switch"
                     and self.depth.get(c, 10 ** 6) <= depth_left]
            self._cands[key] = cands
        if not cands:
            raise _Retry()
        # near the depth limit only the operators whose shortest subtask still fits remain
        # (e.g. under And at the limit: IsSame/NotSame, not And/Or)
        return rng.choice(cands)

    def _build(self, name: str, depth_left: int, rng: random.Random, budget: List[int]) -> Operator:
        budget[0] -= 1
        if budget[0] < 0 or depth_left < 0:
            raise _Retry()
        if name in ("And", "Or"):
            budget[1] += 1
            if budget[1] > self._max_bool:  # stop early instead of rejecting the finished graph
                raise _Retry()
        cls = OPERATORS[name]
        if name == "Select":
            return Select()
        if name in ("IsSame", "NotSame"):
            getters = [g for g in ("GetCategory", "GetLocation", "GetIdentity") if g in self.space.ops]
            if not getters:
                raise _Retry()
            g = rng.choice(getters)
            first = self._build(g, depth_left - 1, rng, budget)
            attr = first.attr
            if attr in CONST_ATTRS and "CONST" in self.space.ops and rng.random() < self.space.const_prob:
                budget[0] -= 1
                second: Operator = CONST(attr=attr)
                if self.space.const_first_prob and rng.random() < self.space.const_first_prob:
                    first, second = second, first
            else:
                second = self._build(g, depth_left - 1, rng, budget)
            return cls(first, second)
        if name == "Exist":
            attr = rng.choice(CONST_ATTRS)
            budget[0] -= 2
            return cls(Select(), CONST(attr=attr))
        slots = self.space.connectivity[name]["children"]
        kids = [self._build(self._choose(slot, depth_left - 1, rng), depth_left - 1, rng, budget) for slot in slots]
        return cls(*kids)

    def _subtask(self, n_switch: int, pool: Sequence[str], depth_left: int, rng: random.Random,
                 budget: List[int]) -> Operator:
        if n_switch > 0:
            budget[0] -= 1
            left = rng.randint(0, n_switch - 1)
            cond = self._build(self._choose(self.space.connectivity["Switch"]["children"][0], depth_left - 1, rng),
                               depth_left - 1, rng, budget)
            branch_pool = self.space.branch_ops or self.space.root_ops
            a = self._subtask(left, branch_pool, depth_left - 1, rng, budget)
            b = self._subtask(n_switch - 1 - left, branch_pool, depth_left - 1, rng, budget)
            return Switch(cond, a, b)
        return self._build(self._choose(pool, depth_left, rng), depth_left, rng, budget)

    def _flat(self, name: str, rng: random.Random) -> Operator:
        """One subtask of style "subtasks" with root ``name``; And/Or over two comparisons."""
        budget = [10 ** 6, 0]
        if name in ("And", "Or"):
            if not self._cmps:
                raise _Retry()
            return OPERATORS[name](*[self._build(rng.choice(self._cmps), 3, rng, budget) for _ in range(2)])
        return self._build(name, 3, rng, budget)

    def _compose(self, n_switch: int, rng: random.Random) -> Operator:
        """The original's composition: each Switch adds a new subtask and a conditional to the task
        so far, which becomes its then- or else-branch with equal probability. Root names are
        drawn first, so the And/Or count is checked before anything is built."""
        pools = self._pools
        first = pools["branch"] if n_switch else pools["root"]
        if not first or (n_switch and not pools["cond"]):
            raise _Retry()
        names = [rng.choice(first)]
        for _ in range(n_switch):
            names += [rng.choice(pools["branch"]), rng.choice(pools["cond"])]
        lim = self.space.bool_ops
        if lim is not None and not lim[0] <= sum(n in ("And", "Or") for n in names) <= lim[1]:
            raise _Retry()
        task = self._flat(names[0], rng)
        for i in range(n_switch):
            new, cond = self._flat(names[1 + 2 * i], rng), self._flat(names[2 + 2 * i], rng)
            task = Switch(cond, task, new) if rng.random() < 0.5 else Switch(cond, new, task)
        return task

    def sample(self, rng: random.Random, name: str = "",
               keep: Optional[Callable[[int], bool]] = None) -> Task:
        """One task graph; bounded retries end with a clear error. ``keep(n_selects)`` may reject
        a graph before the Task is built (presets weigh graphs by their number of objects)."""
        sp = self.space
        for _ in range(self.MAX_TRIES):
            n_switch = rng.randint(sp.min_switch, sp.max_switch)
            try:
                if sp.style == "subtasks":
                    root = self._compose(n_switch, rng)
                else:
                    root = self._subtask(n_switch, sp.root_ops, sp.max_depth, rng, [sp.max_op, 0])
            except _Retry:
                continue
            if keep is not None and not keep(sum(isinstance(n, Select) for n in walk(root))):
                continue
            task = Task(root, name=name)
            if sp.bool_ops is not None and not sp.bool_ops[0] <= task.n_bool_ops <= sp.bool_ops[1]:
                continue
            if sp.max_selects is not None and len(task.selects) > sp.max_selects:
                continue
            return task
        raise ReformError(f"AutoTask found no graph in {self.MAX_TRIES} tries (max_depth={sp.max_depth}, "
                          f"max_op={sp.max_op}, switches={sp.min_switch}..{sp.max_switch}, bool_ops={sp.bool_ops}, "
                          f"root_ops={sp.root_ops}); "
                          "relax max_depth/max_op/bool_ops")


class _Retry(Exception):
    """Internal: the partial graph broke a limit; start over."""
