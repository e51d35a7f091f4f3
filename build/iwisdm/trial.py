"""Trial instantiation: frame layout, backward initialisation, constraint solving, composition.

Why a small constraint solver instead of the original's operator-by-operator value pushing:
the backward pass turns the sampled answer into equal / not-equal / pinned constraints on
object attributes; solving them jointly makes merged Selects (several Selects reading one
frame) and temporally composed tasks consistent by construction, and the answer is then
recomputed forward from the frames, so it is always right. Every attempt is bounded.
"""
from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, cast

from PIL import Image

from .graph import Task
from .operators import (BOOL, Compare, Context, Exist, Get, Switch, answer_word, unwrap_target, walk)
from .stimuli import LOCATIONS, StimulusSet
from ...utils.errors import ReformError

logger = logging.getLogger(__name__)

MAX_ATTEMPTS = 60
COMPOSE_MODES = ("queue", "overlap", "interleave", "timeline")
#: "run": one "delay" for a run of blank frames (paper A.3.4, the original); "per_frame": one per frame
DELAY_WORDINGS = ("run", "per_frame")
#: fixation cross: "upstream" (True): every frame but the response frames, as the original draws
#: its fixation cue (0.1.3 ``generate_trial``); "all": every frame; "none" (False): no cross
FIXATIONS = ("upstream", "all", "none")


def fixation_mode(value: Any) -> str:
    """The fixation setting as one of FIXATIONS (booleans: True = upstream, False = none)."""
    if value is True:
        return "upstream"
    if value is False or value is None:
        return "none"
    if value not in FIXATIONS:
        raise ReformError(f"fixation must be true, false or one of {', '.join(FIXATIONS)}, got {value!r}")
    return str(value)


def fixation_frames(actions: Sequence[Optional[str]], fixation: Any) -> List[bool]:
    """Per frame: whether the fixation cross is drawn (upstream: not on frames that ask a response)."""
    mode = fixation_mode(fixation)
    if mode == "none":
        return [False] * len(actions)
    if mode == "all":
        return [True] * len(actions)
    return [a is None for a in actions]


@dataclass
class Trial:
    """One generated trial: frames (as object metadata), instruction, actions and answer."""

    instruction: str
    frames: List[List[Dict[str, Any]]]   # per frame: the objects shown (empty list: delay frame)
    actions: List[Optional[str]]         # per frame: the required response (None: no response)
    answer: str                          # the final answer word
    response_type: str                   # bool | location | category
    meta: Dict[str, Any] = field(default_factory=dict)
    #: True / "upstream": cross on every frame but the response frames; "all"; False / "none"
    fixation: Any = False

    def fixation_frames(self) -> List[bool]:
        """Per frame: whether the fixation cross is drawn."""
        return fixation_frames(self.actions, self.fixation)

    def render(self, stim: StimulusSet) -> List[Image.Image]:
        """The frame images (224x224 RGB), composed from cached stimuli."""
        return [stim.compose(objs, fix) for objs, fix in zip(self.frames, self.fixation_frames())]

    def to_dict(self) -> Dict[str, Any]:
        return {"instruction": self.instruction, "frames": self.frames, "actions": self.actions,
                "answer": self.answer, "response_type": self.response_type, "meta": self.meta,
                "fixation": self.fixation}

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "Trial":
        fix = d.get("fixation", False)
        return cls(d["instruction"], d["frames"], d["actions"], d["answer"], d["response_type"],
                   d.get("meta", {}), fix if isinstance(fix, str) else bool(fix))


# ---------------------------------------------------------------------------------------------
# Constraint solving
# ---------------------------------------------------------------------------------------------
class _UF:
    __slots__ = ("p",)

    def __init__(self) -> None:
        self.p: Dict[tuple, tuple] = {}

    def find(self, x: tuple) -> tuple:
        p = self.p
        if x not in p:
            p[x] = x
            return x
        while p[x] != x:
            p[x] = p[p[x]]
            x = p[x]
        return x

    def union(self, a: tuple, b: tuple) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.p[ra] = rb


def _assign(keys: Sequence[tuple], uf: _UF, pins: Dict[tuple, Any], ne: Dict[tuple, set],
            domain: Sequence[Any], rng: random.Random, out: Dict[tuple, Any]) -> bool:
    """Give every class one value: pins first, then random values avoiding not-equal neighbours."""
    classes: Dict[tuple, List[tuple]] = {}
    for k in keys:
        classes.setdefault(uf.find(k), []).append(k)
    value: Dict[tuple, Any] = {}
    order = list(classes)
    rng.shuffle(order)
    order.sort(key=lambda r: (r not in pins, -len(ne.get(r, ()))))
    for r in order:
        banned = {value[n] for n in ne.get(r, ()) if n in value}
        if r in pins:
            v = pins[r]
            if v in banned:
                return False
        else:
            choices = [v for v in domain if v not in banned]
            if not choices:
                return False
            v = rng.choice(choices)
        value[r] = v
    for r, members in classes.items():
        for k in members:
            out[k] = value[r]
    return True


def solve(ctx: Context, n_objects: int, const_terms: Sequence[tuple], domains: Dict[str, Sequence[Any]],
          fixed: Dict[tuple, Any]) -> Optional[Dict[tuple, Any]]:
    """Values for every object attribute and free CONST satisfying ``ctx.cons``; None if none found."""
    cons = ctx.cons
    rng = ctx.rng
    uf = _UF()
    keys: Dict[str, List[tuple]] = {"location": [], "category": [], "idx": []}
    for k in range(1, n_objects + 1):
        for attr in keys:
            t = (attr, "o", k)
            keys[attr].append(t)
            uf.find(t)
    for t in const_terms:
        keys[t[0]].append(t)
        uf.find(t)
    for a, b in cons.eq:
        uf.union(a, b)
    for oa, ob in cons.id_eq:
        uf.union(("category", "o", oa), ("category", "o", ob))
        uf.union(("idx", "o", oa), ("idx", "o", ob))
    pins: Dict[tuple, Any] = {}
    for t, v in list(cons.pin) + list(fixed.items()):
        r = uf.find(t)
        if r in pins and pins[r] != v:
            return None
        pins[r] = v
    ne: Dict[tuple, set] = {}
    for a, b in cons.ne:
        ra, rb = uf.find(a), uf.find(b)
        if ra == rb:
            return None
        ne.setdefault(ra, set()).add(rb)
        ne.setdefault(rb, set()).add(ra)
    out: Dict[tuple, Any] = {}
    if not _assign(keys["location"], uf, pins, ne, domains["location"], rng, out):
        return None
    if not _assign(keys["category"], uf, pins, ne, domains["category"], rng, out):
        return None
    for oa, ob in cons.id_ne:
        if out[("category", "o", oa)] == out[("category", "o", ob)]:
            ra, rb = uf.find(("idx", "o", oa)), uf.find(("idx", "o", ob))
            if ra == rb:
                return None
            ne.setdefault(ra, set()).add(rb)
            ne.setdefault(rb, set()).add(ra)
    if not _assign(keys["idx"], uf, pins, ne, domains["idx"], rng, out):
        return None
    return out


# ---------------------------------------------------------------------------------------------
# Frame layout
# ---------------------------------------------------------------------------------------------
def _auto_layout(task: Task, n_frames: int, rng: random.Random, merge_prob: float
                 ) -> Optional[Tuple[Dict[int, int], List[int]]]:
    """Map Selects to objects and objects to frames for a task without ``when``s.

    Selects beyond the frame budget share an object (merging), never with the other side of
    their own comparison; the first and last frames hold objects, delays fall in between.
    """
    sels = [s.uid for s in task.selects]
    n_sel = len(sels)
    hi = min(n_sel, n_frames)
    n_obj = hi
    if hi > 2 and rng.random() < merge_prob:
        n_obj -= 1
    if n_sel > 1 and n_obj < 2:
        return None
    perm = sels[:]
    rng.shuffle(perm)
    obj_of: Dict[int, int] = {}
    for i, uid in enumerate(perm[:n_obj]):
        obj_of[uid] = i + 1
    for uid in perm[n_obj:]:
        taken = {obj_of[s] for s in task.siblings[uid] if s in obj_of}
        choices = [k for k in range(1, n_obj + 1) if k not in taken]
        if not choices:
            return None
        obj_of[uid] = rng.choice(choices)
    if n_obj == 1:
        frames = [n_frames - 1]
    else:
        frames = [0] + sorted(rng.sample(range(1, n_frames - 1), n_obj - 2)) + [n_frames - 1]
    return obj_of, frames


class DelayProcess:
    """The original's placement of objects in time (iwisdm 0.1.3 ``sample_when``).

    From the response frame backwards: the last frame holds an object; before each further
    object, a delay frame is inserted with probability ``p`` while fewer than ``max_delay`` delays
    were placed. Presets condition it on an exact frame count, as the upstream benchmark does by
    rejection: ``prob`` weighs a task by how often its number of objects gives that count, and
    ``sample_gaps`` draws the delay runs exactly from the conditioned process.
    """

    def __init__(self, p: float = 0.5, max_delay: int = 4) -> None:
        if not 0.0 <= p < 1.0 or max_delay < 0:
            raise ReformError(f"delay process needs 0 <= delay_prob < 1 and max_delay >= 0, got {p}, {max_delay}")
        self.p, self.max_delay = float(p), int(max_delay)
        self._memo: Dict[Tuple[int, int, int], float] = {}

    def _f(self, k: int, d: int, total: int) -> float:
        """P(the process ends with exactly ``total`` delays | k placements left, d delays so far)."""
        if d > total:
            return 0.0
        if k == 0:
            return 1.0 if d == total else 0.0
        key = (k, d, total)
        v = self._memo.get(key)
        if v is None:
            if d < self.max_delay:
                v = self.p * self._f(k, d + 1, total) + (1 - self.p) * self._f(k - 1, d, total)
            else:
                v = self._f(k - 1, d, total)
            self._memo[key] = v
        return v

    def prob(self, n_obj: int, n_delay: int) -> float:
        """P(exactly ``n_delay`` delay frames | ``n_obj`` objects)."""
        if n_obj < 1 or n_delay < 0:
            return 0.0
        return self._f(n_obj - 1, 0, n_delay)

    def sample_gaps(self, n_obj: int, n_delay: int, rng: random.Random) -> List[int]:
        """Delay frames before each object after the last one (from the end), given their total."""
        gaps: List[int] = []
        k, d, g = n_obj - 1, 0, 0
        while k > 0:
            here = self._f(k, d, n_delay)
            if d < self.max_delay and rng.random() * here < self.p * self._f(k, d + 1, n_delay):
                d, g = d + 1, g + 1
            else:
                gaps.append(g)
                k, g = k - 1, 0
        return gaps

    def frames(self, n_obj: int, n_frames: int, rng: random.Random) -> Optional[List[int]]:
        """Sorted frame indices of ``n_obj`` objects among ``n_frames``; None if impossible."""
        if self.prob(n_obj, n_frames - n_obj) <= 0.0:
            return None
        pos = n_frames - 1
        out = [pos]
        for g in self.sample_gaps(n_obj, n_frames - n_obj, rng):
            pos -= g + 1
            out.append(pos)
        return out[::-1]


def _process_layout(task: Task, n_frames: int, rng: random.Random, process: DelayProcess
                    ) -> Optional[Tuple[Dict[int, int], List[int]]]:
    """One object per Select (as the original), placed in time by the original's delay process."""
    sels = [s.uid for s in task.selects]
    frames = process.frames(len(sels), n_frames, rng)
    if frames is None:
        return None
    rng.shuffle(sels)
    return {uid: i + 1 for i, uid in enumerate(sels)}, frames


def _defect(task: Task, ctx: Context, values: Dict[tuple, Any]) -> Optional[str]:
    """Why a solved trial is degenerate, or None: a comparison repeated (in either order or
    negated), or a Switch branch that reads only what its own condition reads (so the condition
    fixes or constrains its value)."""
    def operand(n: Any) -> tuple:
        if isinstance(n, Get):
            return ("get", n.attr, ctx.obj_of[n.children[0].uid])
        return ("const", n.value if n.value is not None else values.get(n.term(ctx)))

    seen = set()
    for n in task.nodes:
        if isinstance(n, Compare):
            key = tuple(sorted(map(repr, (operand(n.children[0]), operand(n.children[1])))))
            if key in seen:
                return "repeated comparison"
            seen.add(key)
    for n in task.nodes:
        if isinstance(n, Switch):
            cond = _terms(n.children[0], ctx)
            for b in n.children[1:]:
                t = _terms(b, ctx)
                if t and t <= cond:
                    return "branch fixed by its condition"
    return None


def _terms(node: Any, ctx: Context) -> set:
    """(attribute, object) pairs a subtask reads."""
    out = set()
    for n in walk(node):
        if isinstance(n, Get):
            out.add((n.attr, ctx.obj_of[n.children[0].uid]))
        elif isinstance(n, Exist):
            out.add((n.children[1].attr, ctx.obj_of[n.children[0].uid]))
    return out


def _explicit_layout(tasks: Sequence[Task], offsets: Sequence[Any], n_frames: int
                     ) -> Tuple[List[Dict[int, int]], List[int]]:
    """Objects from global frame indices; Selects on one frame share an object."""
    glob: List[Dict[int, int]] = []
    frames_used = set()
    for task, off in zip(tasks, offsets):
        m: Dict[int, int] = {}
        for s in task.selects:
            assert s.when is not None and task.n_frames is not None  # composed tasks are explicit (compose)
            local = s.when % task.n_frames
            g = off(local) if callable(off) else off + local
            m[s.uid] = g
            frames_used.add(g)
        glob.append(m)
    frames = sorted(frames_used)
    num = {f: i + 1 for i, f in enumerate(frames)}
    return [{uid: num[g] for uid, g in m.items()} for m in glob], frames


# ---------------------------------------------------------------------------------------------
# Instantiation
# ---------------------------------------------------------------------------------------------
class TrialGenerator:
    """Instantiates trials of tasks with one stimulus set (holds the reusable domains)."""

    def __init__(self, stim: StimulusSet) -> None:
        self.stim = stim
        self.domains: Dict[str, Sequence[Any]] = {"location": LOCATIONS, "category": stim.categories,
                                                  "idx": tuple(range(stim.n_identities))}
        self.answer_spaces: Dict[str, Sequence[Any]] = {BOOL: (True, False), "location": LOCATIONS,
                                                        "category": stim.categories}

    def instantiate(self, task: Task, rng: random.Random, n_frames: Optional[int] = None,
                    merge_prob: float = 0.2, n_distractors: int = 0, fixation: Any = False,
                    picker: Optional[Callable[[str, Sequence[Any]], Any]] = None,
                    delays: Optional[DelayProcess] = None, delay_wording: str = "run") -> Trial:
        """One trial of one task with a balanced answer (drawn uniformly from the root's space,
        or by ``picker(response_type, space)``).

        With ``delays`` (and ``merge_prob`` 0) every Select reads its own object and objects are
        placed in time by the original's delay process; otherwise Selects may share objects
        (``merge_prob``, or more Selects than frames) and delays fall uniformly between the first
        and last frames. Degenerate trials (``_defect``) are re-drawn."""
        if delay_wording not in DELAY_WORDINGS:
            raise ReformError(f"unknown delay wording '{delay_wording}'; valid: {', '.join(DELAY_WORDINGS)}")
        if task.explicit:
            return self.compose([task], rng, mode="timeline", n_distractors=n_distractors, fixation=fixation,
                                picker=picker, delay_wording=delay_wording)
        if n_frames is None:
            raise ReformError(f"task {task.name or task}: an AutoTask graph needs n_frames")
        target = task.root.sample_target(Context({}, rng, self.answer_spaces, picker))
        for _ in range(MAX_ATTEMPTS):
            if delays is not None and not merge_prob:
                lay = _process_layout(task, n_frames, rng, delays)
            else:
                lay = _auto_layout(task, n_frames, rng, merge_prob)
            if lay is None:
                continue
            obj_of, frames = lay
            ctx = Context(obj_of, rng, self.answer_spaces)
            task.root.backward(target, ctx)
            values = solve(ctx, len(frames), self._const_terms(task, ctx), self.domains, {})
            if values is None or _defect(task, ctx, values) is not None:
                continue
            return self._finish([task], [ctx], [target], [obj_of], frames, n_frames, values, rng,
                                n_distractors, fixation, delay_wording=delay_wording)
        raise ReformError(f"task {task.name or task.counts}: no consistent trial in {MAX_ATTEMPTS} attempts "
                          f"for answer {answer_word(unwrap_target(target))!r} with {n_frames} frames")

    def compose(self, tasks: Sequence[Task], rng: random.Random, mode: str = "queue",
                n_distractors: int = 0, fixation: Any = False,
                picker: Optional[Callable[[str, Sequence[Any]], Any]] = None, delay_wording: str = "run") -> Trial:
        """Temporal composition of hand-made tasks (every Select has ``when``).

        queue: one after the other; overlap: each task's first frame is the previous task's
        last; interleave: frames alternate; timeline: ``when``s are already global. Conflicts
        are resolved forward: earlier tasks keep their values, later ones are re-drawn.
        """
        if mode not in COMPOSE_MODES:
            raise ReformError(f"unknown composition mode '{mode}'; valid: {', '.join(COMPOSE_MODES)}")
        lengths: List[int] = []
        for t in tasks:
            if not t.explicit:
                raise ReformError(f"task {t.name or t.counts}: composition needs Selects with 'when'")
            if t.n_frames is None:  # not after validate_task: an explicit task has n_frames
                raise ReformError(f"task {t.name or t.counts}: composition needs n_frames")
            lengths.append(t.n_frames)
        offsets: List[Any] = []
        pos = 0
        for i, n in enumerate(lengths):
            if mode == "timeline":
                offsets.append(0)
            elif mode == "queue":
                offsets.append(pos)
                pos += n
            elif mode == "overlap":
                offsets.append(pos)
                pos += n - 1
            else:
                offsets.append(lambda local, i=i: local * len(tasks) + i)
        ends = []
        for n, off in zip(lengths, offsets):
            ends.append(off(n - 1) if callable(off) else off + n - 1)
        n_frames = max(ends) + 1
        maps, frames = _explicit_layout(tasks, offsets, n_frames)
        order = sorted(range(len(tasks)), key=lambda i: ends[i])
        fixed: Dict[tuple, Any] = {}
        ctxs: List[Optional[Context]] = [None] * len(tasks)
        targets: List[Any] = [None] * len(tasks)
        for i in order:
            task = tasks[i]
            targets[i] = task.root.sample_target(Context({}, rng, self.answer_spaces, picker))
            for _ in range(MAX_ATTEMPTS):
                ctx = Context(maps[i], rng, self.answer_spaces)
                task.root.backward(targets[i], ctx)
                values = solve(ctx, len(frames), self._const_terms(task, ctx), self.domains, fixed)
                if values is not None:
                    break
            else:
                raise ReformError(f"task {task.name or task.counts}: cannot produce answer "
                                  f"{answer_word(unwrap_target(targets[i]))!r} consistently with the earlier tasks")
            ctxs[i] = ctx
            mine = set(maps[i].values())
            for k, v in values.items():
                if k[1] == "o" and k[2] in mine:
                    fixed[k] = v
            fixed.update({k: v for k, v in values.items() if k[1] == "c" and k not in fixed})
        # all object values: the last solve includes every pinned value; fill unseen objects
        assert values is not None  # each task's loop ends on a solution or raises
        values.update(fixed)
        return self._finish(list(tasks), cast(List[Context], ctxs), targets, maps, frames, n_frames, values, rng,
                            n_distractors, fixation, ends=ends, delay_wording=delay_wording)

    @staticmethod
    def _const_terms(task: Task, ctx: Context) -> List[tuple]:
        return [(n.attr, "c", id(n)) for n in task.nodes if n.name == "CONST"]

    def _finish(self, tasks: List[Task], ctxs: List[Context], targets: List[Any], maps: List[Dict[int, int]],
                frames: List[int], n_frames: int, values: Dict[tuple, Any], rng: random.Random,
                n_distractors: int, fixation: Any, ends: Optional[List[int]] = None,
                delay_wording: str = "run") -> Trial:
        n_obj = len(frames)
        objects = {k: {"category": values[("category", "o", k)], "identity": values[("idx", "o", k)],
                       "view": rng.randrange(self.stim.n_views), "location": values[("location", "o", k)]}
                   for k in range(1, n_obj + 1)}
        # which attributes each object is read for, and which objects Exist looks at
        used: Dict[int, set] = {k: set() for k in objects}
        exist_objs = set()
        for task, m in zip(tasks, maps):
            for n in task.nodes:
                if isinstance(n, Get):
                    used[m[n.children[0].uid]].add(n.attr)
                elif isinstance(n, Exist):
                    exist_objs.add(m[n.children[0].uid])
        frame_objs: List[List[Dict[str, Any]]] = [[] for _ in range(n_frames)]
        qualifier: Dict[int, str] = {}
        n_distr_total = 0
        for k, f in zip(range(1, n_obj + 1), frames):
            target = objects[k]
            frame_objs[f].append(target)
            if n_distractors <= 0 or k in exist_objs:
                continue
            if "location" not in used[k]:
                name_attr = "location"
            elif not used[k] & {"category", "identity"}:
                name_attr = "category"
            else:
                continue
            free_locs = [loc for loc in LOCATIONS if loc != target["location"]]
            rng.shuffle(free_locs)
            for loc in free_locs[:n_distractors]:
                cats = self.stim.categories if name_attr == "location" else \
                    [c for c in self.stim.categories if c != target["category"]]
                frame_objs[f].append({"category": rng.choice(cats), "identity": rng.randrange(self.stim.n_identities),
                                      "view": rng.randrange(self.stim.n_views), "location": loc,
                                      "distractor": True})
                n_distr_total += 1
            qualifier[k] = f" with {name_attr}: {target[name_attr]}"
        for k in objects:
            if len(frame_objs[frames[k - 1]]) > 1:
                # Exist reads the whole frame
                for ctx in ctxs:
                    ctx.values[("frame_objects", k)] = frame_objs[frames[k - 1]]
        # forward pass: answers recomputed from the frames
        answers = []
        for task, ctx, target in zip(tasks, ctxs, targets):
            ctx.objects = objects
            ctx.values.update(values)
            got = task.root.forward(ctx)
            want = unwrap_target(target)
            if got != want:
                raise AssertionError(f"internal error: forward answer {got!r} != backward target {want!r}")
            answers.append(got)
        # instruction and actions
        ends = ends or [n_frames - 1]
        questions: Dict[int, List[str]] = {}
        for task, ctx, end in zip(tasks, ctxs, ends):
            q = task.root.phrase(ctx, top=True)
            questions.setdefault(end, []).append(q if isinstance(task.root, Switch) else q + "?")
        obj_at = {f: k for k, f in zip(range(1, n_obj + 1), frames)}
        items: List[str] = []
        actions: List[Optional[str]] = [None] * n_frames
        for f in range(n_frames):
            if f in obj_at:
                k = obj_at[f]
                items.append(f"observe object {k}{qualifier.get(k, '')}")
            elif delay_wording == "per_frame" or not items or items[-1] != "delay":
                items.append("delay")
            items.extend(questions.get(f, []))
        for end, ans in zip(ends, answers):
            actions[end] = answer_word(ans)
        last = max(range(len(tasks)), key=lambda i: ends[i])
        final = answers[last]
        rtype = BOOL if isinstance(final, bool) else ("location" if final in LOCATIONS else "category")
        counts: Dict[str, int] = {}
        features = set()
        for t in tasks:
            for k2, v in t.counts.items():
                counts[k2] = counts.get(k2, 0) + v
            features.update(t.features)
        meta = {"n_frames": n_frames, "n_stimuli": n_obj, "n_delay": n_frames - n_obj,
                "n_distractors": n_distr_total, "op_counts": counts,
                "n_and": counts.get("And", 0), "n_or": counts.get("Or", 0),
                "n_is_same": counts.get("IsSame", 0), "n_not_same": counts.get("NotSame", 0),
                "n_switch": counts.get("Switch", 0), "features": sorted(features),
                "task_names": [t.name for t in tasks if t.name]}
        fixation_mode(fixation)  # reject an unknown setting here, not at rendering
        return Trial(", ".join(items), frame_objs, actions, answer_word(final), rtype, meta, fixation)
