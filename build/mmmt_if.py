"""MMMT-IF builder: MMDU chats with global answer-format instructions, one sample per turn.

Why a builder of its own: MMMT-IF is multi-turn and multi-image. Each turn becomes one
sample whose ``history`` holds the earlier turns of its chat (assistant turns point to
their sample via ``source_sample_id`` so run_eval can substitute the model's own answers),
whose ``images`` are all images introduced so far, and whose ``meta.instructions`` is the
cumulative instruction list the PIF metric checks.

Three sources (config key ``source``):
- ``mmdu``: an MMDU ``benchmark.json`` + image folder; instructions are injected with the
  paper's seeded procedure (probability 1 - k/6, one unused category, uniform choice).
- ``release``: the public release CSV matched to MMDU chats by question text (the CSV has
  no images and no reference answers); its instructions are used as released.
- ``release_only``: the release CSV alone (no images, no references), for statistics/tests.
"""
from __future__ import annotations

import logging
import math
import os
import re
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Any, ClassVar, Dict, List, Optional, Sequence, Tuple

from .registry import COUNT, FLAG, PATH, Builder, one_of, register_builder
from ..utils.schema import IMAGE_TOKEN
from .mmmt_if_instructions import (CATEGORIES, CATEGORY_OF, INSTRUCTION_TEXTS, split_instruction_list,
                                        split_instruction_prefix)
from ..utils.errors import ReformError, input_error, missing_path
from ..utils.images import check_image
from ..utils.inputs import read_csv, read_json
from ..utils.seeding import rng_for

logger = logging.getLogger(__name__)

MMDU_IMAGE_TOKEN = "<ImageHere>"
MAX_INSTRUCTIONS = len(CATEGORIES)
#: an MMDU image introduction such as "Image1: <ImageHere>." (or a bare token)
_INTRO_RE = re.compile(r"(?:Image\s*\d+\s*[:：]?\s*)?" + re.escape(MMDU_IMAGE_TOKEN) + r"\s*[.,;:]?")
#: the same introduction after <ImageHere> became the prompt's image token
_PROMPT_INTRO_RE = re.compile(r"(?:Image\s*\d+\s*[:：]?\s*)?" + re.escape(IMAGE_TOKEN) + r"\s*[.,;:]?")
_PROMPT_INTRO_TRAILING_RE = re.compile(_PROMPT_INTRO_RE.pattern + r"[ \t]*")
IMAGE_PLACEMENTS = ("start", "turn")
SOURCES = ("mmdu", "release", "release_only")

# release CSV columns
COL_CHAT = "conversation id"
COL_TURN = "turn count (which turn in this conversation)"
COL_PROMPT = "prompt"
COL_ALL = "all instructions"
COL_COUNT = "instruction count"
#: the largest turn number read from the release (its chats have at most 20 turns)
MAX_TURN = 10_000
RELEASE_MODELS = ("Gemini", "GPT-4o", "Sonnet")


def chat_error(message: str, chat_id: Any, turn: Any = None, file: Optional[str] = None) -> ReformError:
    """A ReformError naming the chat (and turn) it refers to."""
    where = f"chat {chat_id}" + (f" turn {turn}" if turn is not None else "")
    return input_error(f"{where}: {message}", file=file)


def normalize_ws(text: str) -> str:
    """Collapse whitespace (the release CSV hard-wraps its text cells)."""
    return " ".join(str(text).split())


def question_key(text: str) -> str:
    """Matching key for a question: image introductions dropped, whitespace and case folded."""
    return normalize_ws(_INTRO_RE.sub(" ", text)).casefold()


def instruction_prefix(text: str) -> str:
    """How an instruction is put before a question: ``"Instruction: <text> "``."""
    return f"Instruction: {text} "


# ---------------------------------------------------------------------------------------
# Instruction injection (paper section 1)
# ---------------------------------------------------------------------------------------

#: P(a new instruction before a turn | k given so far) estimated from the release CSV:
#: (turns with k given where one was added) / (turns with k given), over its 71 chats in
#: file order. The paper's stated rule 1 - k/6 gives far fewer 6-instruction turns (about
#: 226 of 990 against the release's 464); see docs/mmmt_if.md, "Injection".
RELEASE_ADD_COUNTS: Dict[int, Tuple[int, int]] = {0: (71, 79), 1: (70, 90), 2: (69, 96), 3: (69, 85),
                                                  4: (69, 99), 5: (64, 141)}
RELEASE_ADD_PROBABILITY: Dict[int, float] = {k: a / n for k, (a, n) in RELEASE_ADD_COUNTS.items()}
INJECTION_RULES = ("release", "paper_formula")


def add_probability(k: int, rule: str = "release") -> float:
    """P(an instruction is added before a turn | k given so far) under ``rule``."""
    if k >= MAX_INSTRUCTIONS:
        return 0.0
    if rule == "release":
        return RELEASE_ADD_PROBABILITY[k]
    if rule == "paper_formula":
        return 1.0 - k / MAX_INSTRUCTIONS
    raise ReformError(f"unknown injection rule {rule!r}; valid: {', '.join(INJECTION_RULES)}")


def inject_instructions(n_turns: int, seed: int, chat_key: Any,
                        max_instructions: int = MAX_INSTRUCTIONS, rule: str = "release") -> List[Optional[str]]:
    """The instruction id added before each turn (None where none is added).

    Before each question, with probability ``add_probability(k, rule)`` (k = instructions
    given so far) one instruction is added: a category not used yet chosen uniformly, then
    one of its instructions uniformly. Deterministic in (seed, chat_key, rule).
    """
    add_probability(0, rule)  # validates the rule name
    rng = rng_for(seed, "MMMT-IF", "instructions", chat_key)
    given: List[str] = []
    out: List[Optional[str]] = []
    for _ in range(n_turns):
        k = len(given)
        added = None
        if k < max_instructions and rng.random() < add_probability(k, rule):
            used = {CATEGORY_OF[i] for i in given}
            category = rng.choice([c for c in CATEGORIES if c not in used])
            added = rng.choice(CATEGORIES[category])
            given.append(added)
        out.append(added)
    return out


# ---------------------------------------------------------------------------------------
# MMDU
# ---------------------------------------------------------------------------------------

@dataclass
class MMDUChat:
    """One MMDU chat: image paths (as listed) and (user text, reference answer) turns."""

    chat_id: str
    images: List[str]
    turns: List[Tuple[str, str]]


#: the way on from a missing MMDU file, in one place whatever the door (run_eval, the library,
#: commands/mmmt_if_llava.sh): the quick run on the release alone, or the user's copy
MMDU_HINT = ("quick run without MMDU (the release's questions, no images): --dataset_config mmmt_if_release_only "
             "--dataset_subsample 3; your MMDU copy: --dataset_option mmdu_json=/path/to/benchmark.json "
             "--dataset_option image_folder=/path/to/mmdu_pics")


def check_mmdu_file(path: str) -> str:
    """``path`` if it is a file; else the one error for a missing MMDU file."""
    if not os.path.isfile(path):
        raise missing_path(path, "MMDU benchmark file", hint=MMDU_HINT)
    return path


def check_release_csv(path: str) -> str:
    """``path`` if it is a file; else the one error for a missing release CSV."""
    if not os.path.isfile(path):
        raise missing_path(path, "MMMT-IF release CSV")
    return path


def load_mmdu(path: str) -> List[MMDUChat]:
    """Read an MMDU ``benchmark.json`` (a list of items or a dict keyed by id)."""
    check_mmdu_file(path)
    data = read_json(path, "MMDU benchmark file")
    if isinstance(data, dict):
        items = [dict(v, id=v.get("id", k)) if isinstance(v, dict) else v for k, v in data.items()]
    elif isinstance(data, list):
        items = data
    else:
        raise input_error("expected a list of chats or a dict keyed by chat id", file=path)
    chats: List[MMDUChat] = []
    for n, item in enumerate(items):
        if not isinstance(item, dict):
            raise input_error("a chat must be an object", file=path, record=n)
        cid = str(item.get("id", n))
        images = item.get("image", item.get("images", []))
        if isinstance(images, str):
            images = [images]
        convs = item.get("conversations")
        if not isinstance(images, list) or not isinstance(convs, list):
            raise chat_error("needs a list 'image' and a list 'conversations'", cid, file=path)
        turns: List[Tuple[str, str]] = []
        for j, msg in enumerate(convs):
            role = str(msg.get("from", "")).lower() if isinstance(msg, dict) else ""
            value = msg.get("value") if isinstance(msg, dict) else None
            if not isinstance(value, str):
                raise chat_error(f"message {j} has no text 'value'", cid, len(turns) + 1, file=path)
            if role in ("user", "human"):
                turns.append((value, ""))
            elif role in ("assistant", "gpt"):
                if not turns or turns[-1][1]:
                    raise chat_error(f"message {j}: an assistant message without a question", cid,
                                     len(turns), file=path)
                turns[-1] = (turns[-1][0], value)
            else:
                raise chat_error(f"message {j} has unknown role {role!r}", cid, len(turns) + 1, file=path)
        chats.append(MMDUChat(cid, [str(p) for p in images], turns))
    return chats


def check_image_tokens(chat: MMDUChat, file: Optional[str] = None) -> None:
    """The <ImageHere> tokens of a chat must match its image list, one to one."""
    seen = 0
    for t, (text, _) in enumerate(chat.turns, 1):
        seen += text.count(MMDU_IMAGE_TOKEN)
        if seen > len(chat.images):
            raise chat_error(f"{seen} {MMDU_IMAGE_TOKEN} tokens so far but only {len(chat.images)} images",
                             chat.chat_id, t, file=file)
    if seen != len(chat.images):
        raise chat_error(f"{seen} {MMDU_IMAGE_TOKEN} tokens but {len(chat.images)} images",
                         chat.chat_id, len(chat.turns), file=file)


# ---------------------------------------------------------------------------------------
# Release CSV
# ---------------------------------------------------------------------------------------

@dataclass
class ReleaseTurn:
    """One row of the release CSV, parsed."""

    chat_id: str
    turn: int
    question: str                      # whitespace-normalised, without the instruction prefix
    new_instruction: Optional[str]     # id added at this turn
    instruction_text: Optional[str]    # its wording as released
    instructions: List[str]            # cumulative ids from the prompts (the ground truth used)
    listed: Optional[List[str]]        # ids parsed from 'all instructions' (None: malformed)
    instruction_count: Optional[int]
    topic: str = ""
    capability: str = ""
    reported_pif: Dict[str, Optional[float]] = field(default_factory=dict)


@dataclass
class ReleaseData:
    """The release CSV: turns in file order, chats in order, and the irregularities found."""

    turns: List[ReleaseTurn]
    chats: "OrderedDict[str, List[ReleaseTurn]]"
    irregularities: List[str]
    texts: Dict[str, str]              # instruction id -> release wording


def _float_or_none(x: Any) -> Optional[float]:
    """A finite number, else None (a 400-digit or "inf" score is no score)."""
    try:
        v = float(x)
    except (TypeError, ValueError, OverflowError):
        return None
    return v if math.isfinite(v) else None


def load_release(path: str) -> ReleaseData:
    """Parse the release CSV faithfully; irregularities are reported, not fatal.

    Fatal (ReformError naming chat and turn): missing columns, a non-integer turn, a prompt
    starting with an unknown instruction text.
    """
    check_release_csv(path)
    _, rows = read_csv(path, "MMMT-IF release CSV", required=(COL_CHAT, COL_TURN, COL_PROMPT, COL_ALL, COL_COUNT))
    chats: "OrderedDict[str, List[ReleaseTurn]]" = OrderedDict()
    turns: List[ReleaseTurn] = []
    irregular: List[str] = []
    texts: Dict[str, str] = {}
    zero_count: List[str] = []
    for n, row in enumerate(rows):
        cid = str(row[COL_CHAT]).strip()
        try:
            tno = int(str(row[COL_TURN]).strip())
        except ValueError:
            raise chat_error(f"turn number {row[COL_TURN][:40]!r} is not an integer (row {n + 2})",
                             cid, file=path) from None
        if not 0 <= tno <= MAX_TURN:
            raise chat_error(f"turn number {str(tno)[:40]} is outside 0..{MAX_TURN} (row {n + 2})", cid, file=path)
        prompt = normalize_ws(row[COL_PROMPT])
        try:
            new_id, question = split_instruction_prefix(prompt)
        except ReformError as e:
            raise chat_error(str(e), cid, tno, file=path) from None
        text = None
        if new_id is not None:
            text = normalize_ws(prompt[:len(prompt) - len(question)])
            text = re.sub(r"^Instruction:\s*", "", text, flags=re.I)
            texts.setdefault(new_id, text)
        prev = chats[cid][-1].instructions if cid in chats else []
        if new_id is not None and new_id in prev:
            irregular.append(f"chat {cid} turn {tno}: instruction {new_id} given again")
        cumulative = prev + [new_id] if new_id is not None and new_id not in prev else list(prev)
        all_text = normalize_ws(row[COL_ALL])
        listed: Optional[List[str]] = None
        if not all_text:
            listed = []
        elif all_text.lower().startswith("instruction:"):
            try:
                listed = split_instruction_list(all_text)
            except ReformError as e:
                irregular.append(f"chat {cid} turn {tno}: 'all instructions' unreadable ({e})")
        else:
            irregular.append(f"chat {cid} turn {tno}: 'all instructions' holds no instruction list "
                             f"(starts {all_text[:60]!r}); the prompts' cumulative list is used")
        count = None
        try:
            count = int(float(str(row[COL_COUNT]).strip()))
        except (ValueError, OverflowError):
            irregular.append(f"chat {cid} turn {tno}: instruction count {row[COL_COUNT]!r} is not a number")
        if listed is not None and listed != cumulative:
            irregular.append(f"chat {cid} turn {tno}: 'all instructions' {listed} differs from the "
                             f"prompts' cumulative list {cumulative}")
        if count is not None and count != len(cumulative):
            irregular.append(f"chat {cid} turn {tno}: instruction count {count} but {len(cumulative)} given")
        if count == 0:
            zero_count.append(f"{cid}/{tno}")
        rt = ReleaseTurn(cid, tno, question, new_id, text, cumulative, listed, count,
                         str(row.get("question topic", "") or ""), str(row.get("LLM capability tested", "") or ""),
                         {m: _float_or_none(row.get(f"Programmatic Instruction Following {m}"))
                          for m in RELEASE_MODELS})
        if cid in chats and tno <= chats[cid][-1].turn:
            irregular.append(f"chat {cid}: turn {tno} out of order after turn {chats[cid][-1].turn}")
        chats.setdefault(cid, []).append(rt)
        turns.append(rt)
    for cid, rts in chats.items():
        numbers = [t.turn for t in rts]
        gaps = sorted(set(range(1, max(numbers) + 1)) - set(numbers))
        for g in gaps:
            irregular.append(f"chat {cid}: no turn {g}")
    if zero_count:
        irregular.append(f"{len(zero_count)} turns with instruction count 0 (chat/turn: {', '.join(zero_count)})")
    return ReleaseData(turns, chats, irregular, texts)


def release_statistics(data: ReleaseData) -> Dict[str, Any]:
    """Counts and the released per-model PIF means (paper Table 3 first row)."""
    stats: Dict[str, Any] = {
        "num_turns": len(data.turns),
        "num_chats": len(data.chats),
        "max_turns_per_chat": max(len(v) for v in data.chats.values()),
        "instruction_count_histogram": dict(sorted(Counter(len(t.instructions) for t in data.turns).items())),
        "instruction_frequency": dict(Counter(i for t in data.turns for i in t.instructions)),
        "num_irregularities": len(data.irregularities),
    }
    for m in RELEASE_MODELS:
        vals = [v for t in data.turns if (v := t.reported_pif.get(m)) is not None]
        if vals:
            stats[f"reported_pif_{m}"] = sum(vals) / len(vals)
    return stats


# ---------------------------------------------------------------------------------------
# The builder
# ---------------------------------------------------------------------------------------

@dataclass
class _PlannedTurn:
    user_text: str            # with IMAGE_TOKEN placeholders
    answer: str
    turn: int                 # turn number reported in meta
    new_instruction: Optional[str]
    prefix: str               # "Instruction: ... " or ''
    extra_meta: Dict[str, Any] = field(default_factory=dict)


@register_builder("MMMT-IF")
class MMMTIFBuilder(Builder):
    """Builds MMMT-IF turns from MMDU (+ injected or released instructions) or the release CSV."""

    formulations = ("Generation",)
    default_metric = {"Generation": "pif"}
    #: every config key this builder reads
    option_names: ClassVar[Tuple[str, ...]] = (
        "source", "mmdu_json", "image_folder", "release_csv", "max_images", "max_turns", "check_images",
        "skip_bad_chats", "skip_unmatched", "instructions_at_end", "num_chats", "injection", "images")
    option_specs = {"source": one_of(*SOURCES), "release_csv": PATH, "mmdu_json": PATH,
                    "image_folder": PATH, "max_images": COUNT, "max_turns": COUNT, "check_images": FLAG,
                    "skip_bad_chats": FLAG, "skip_unmatched": FLAG, "instructions_at_end": FLAG, "num_chats": COUNT,
                    "injection": one_of(*INJECTION_RULES), "images": one_of(*IMAGE_PLACEMENTS)}

    def group_key(self, sample: Dict[str, Any]) -> str:
        """A chat is the unit of sharding: its turns run in order on one rank."""
        return str(sample["meta"]["chat_id"])

    # -- options -------------------------------------------------------------------------
    def _opt(self, key: str, default: Any) -> Any:
        v = self.config.get(key, default)
        return default if v is None else v

    def _flag(self, key: str, default: bool = False) -> bool:
        v = self._opt(key, default)
        if isinstance(v, str):
            return v.strip().lower() in ("1", "true", "yes", "on")
        return bool(v)

    def _source(self) -> str:
        src = self.config.get("source")
        if src is None:  # the value itself was checked by option_specs
            src = "release" if self.config.get("release_csv") else "mmdu"
        return src

    def _injection(self) -> str:
        return str(self._opt("injection", "release"))  # checked by option_specs

    # -- entry -----------------------------------------------------------------------------
    def build_items(self, formulation: str, inference_method: str, seed: int) -> List[Dict[str, Any]]:
        if inference_method != "generation":
            raise ReformError("MMMT-IF is scored on generated text; use --infer_method generation")
        self.skipped: Dict[str, int] = {}
        src = self._source()
        if src == "release_only":
            items = self._from_release_only()
        elif src == "release":
            items = self._from_release()
        else:
            items = self._from_mmdu(seed)
        n_chats = len({it["meta"]["chat_id"] for it in items})
        self.build_log.append(f"source={src}: {len(items)} turns in {n_chats} chats"
                              + (f"; skipped {self.skipped}" if self.skipped else ""))
        return items

    def check_inputs(self) -> None:
        src = self._source()
        if src in ("release", "release_only") and self.config.get("release_csv") is not None:
            check_release_csv(self.resolve_path(self.config["release_csv"]))
        if src in ("release", "mmdu") and self.config.get("mmdu_json") is not None:
            check_mmdu_file(self.resolve_path(self.config["mmdu_json"]))

    # -- shared: images and emission -----------------------------------------------------
    def _image_folder(self) -> str:
        return self.resolve_path(self.require("image_folder"))

    def _resolve_images(self, chat: MMDUChat, folder: str, mmdu_file: str) -> List[str]:
        root = os.path.realpath(folder)
        out = []
        for k, p in enumerate(chat.images):
            full = os.path.realpath(os.path.join(root, p))
            if os.path.commonpath([root, full]) != root:
                turn = self._turn_of_image(chat, k)
                raise chat_error(f"image path {p!r} escapes the image folder {folder}", chat.chat_id, turn,
                                 file=mmdu_file)
            out.append(full)
        return out

    @staticmethod
    def _turn_of_image(chat: MMDUChat, k: int) -> int:
        seen = 0
        for t, (text, _) in enumerate(chat.turns, 1):
            seen += text.count(MMDU_IMAGE_TOKEN)
            if seen > k:
                return t
        return len(chat.turns)

    def _bad_images(self, paths: Sequence[str]) -> List[str]:
        """Images that are missing or cannot be decoded (the paper drops such chats)."""
        bad = []
        for p in paths:
            try:
                check_image(p)
            except ReformError:
                bad.append(p)
        return bad

    def _skip(self, reason: str, msg: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1
        self.build_log.append(msg)

    def _image_placement(self) -> str:
        return str(self._opt("images", "start"))  # checked by option_specs

    @staticmethod
    def _images_at_start(plan: List[_PlannedTurn]) -> List[_PlannedTurn]:
        """All image introductions of the chat moved, in order, to the start of its first
        question (paper Section 4.2: the chat's images come first); later turns keep their text."""
        intros: List[str] = []
        for pt in plan:
            intros += [m.group(0).strip() for m in _PROMPT_INTRO_RE.finditer(pt.user_text)]
        if not intros:
            return plan
        out: List[_PlannedTurn] = []
        for pos, pt in enumerate(plan):
            text = pt.user_text
            if IMAGE_TOKEN in text:
                text = _PROMPT_INTRO_TRAILING_RE.sub("", text).strip()
            if pos == 0:
                text = " ".join(intros) + "\n" + text
            out.append(_PlannedTurn(text, pt.answer, pt.turn, pt.new_instruction, pt.prefix, pt.extra_meta))
        return out

    def _emit(self, chat_id: str, plan: List[_PlannedTurn], images: List[str],
              meta_extra: Dict[str, Any], texts: Dict[str, str]) -> List[Dict[str, Any]]:
        """One base item per planned turn, with history, images so far and instructions."""
        at_end = self._flag("instructions_at_end")
        placement = self._image_placement()
        if placement == "start":
            plan = self._images_at_start(plan)
        meta_extra = dict(meta_extra, images_at=placement)
        items: List[Dict[str, Any]] = []
        history: List[Dict[str, str]] = []
        given: List[str] = []
        n_img = 0
        for pos, pt in enumerate(plan):
            if pt.new_instruction is not None:
                given.append(pt.new_instruction)
            n_img += pt.user_text.count(IMAGE_TOKEN)
            sid = f"{chat_id}-t{pt.turn:02d}"
            question = pt.prefix + pt.user_text
            if at_end and given:
                question = question.rstrip() + "\n" + " ".join(
                    instruction_prefix(texts.get(i, INSTRUCTION_TEXTS[i])).strip() for i in given)
            meta = {"chat_id": chat_id, "turn": pt.turn, "position": pos + 1, "num_turns": len(plan),
                    "instructions": list(given), "new_instruction": pt.new_instruction,
                    "instructions_at_end": at_end, "num_images": n_img}
            meta.update(meta_extra)
            meta.update(pt.extra_meta)
            items.append({"sample_id": sid, "images": images[:n_img], "question": question,
                          "answer": pt.answer, "history": [dict(h) for h in history], "meta": meta,
                          "instruct": ""})
            history.append({"from": "human", "value": pt.prefix + pt.user_text})
            history.append({"from": "assistant", "value": pt.answer, "source_sample_id": sid})
        return items

    # -- source: MMDU with injected instructions ------------------------------------------
    def _mmdu_chats(self) -> Tuple[List[MMDUChat], str, str]:
        mmdu_file = self.resolve_path(self.require("mmdu_json"))
        return load_mmdu(mmdu_file), mmdu_file, self._image_folder()

    def _from_mmdu(self, seed: int) -> List[Dict[str, Any]]:
        chats, mmdu_file, folder = self._mmdu_chats()
        max_images = int(self._opt("max_images", 5))
        max_turns = int(self._opt("max_turns", 20))
        skip_bad = self._flag("skip_bad_chats")
        check = self._flag("check_images", True)
        limit = self.config.get("num_chats")
        items: List[Dict[str, Any]] = []
        kept = 0
        for chat in chats:
            if limit is not None and kept >= int(limit):
                break
            try:
                check_image_tokens(chat, mmdu_file)
                paths = self._resolve_images(chat, folder, mmdu_file)
            except ReformError as e:
                if not skip_bad:
                    raise
                self._skip("bad_chat", f"skipped: {e}")
                continue
            if len(paths) > max_images:
                self._skip("too_many_images", f"chat {chat.chat_id}: dropped ({len(paths)} images > {max_images})")
                continue
            if not chat.turns:
                self._skip("empty", f"chat {chat.chat_id}: dropped (no turns)")
                continue
            bad = self._bad_images(paths) if check else []
            if bad:
                self._skip("corrupted_images", f"chat {chat.chat_id}: dropped (unreadable images {bad})")
                continue
            turns = chat.turns[:max_turns]
            if len(chat.turns) > max_turns:
                self.build_log.append(f"chat {chat.chat_id}: truncated from {len(chat.turns)} to {max_turns} turns")
                # images introduced after the cut are not shown
                n_img = sum(t.count(MMDU_IMAGE_TOKEN) for t, _ in turns)
                paths = paths[:n_img]
            added = inject_instructions(len(turns), seed, chat.chat_id, rule=self._injection())
            plan = [_PlannedTurn(text.replace(MMDU_IMAGE_TOKEN, IMAGE_TOKEN), answer, t + 1, new,
                                 instruction_prefix(INSTRUCTION_TEXTS[new]) if new else "")
                    for t, ((text, answer), new) in enumerate(zip(turns, added))]
            items += self._emit(chat.chat_id, plan, paths, {"source": "mmdu", "mmdu_id": chat.chat_id}, {})
            kept += 1
        return items

    # -- source: release CSV ----------------------------------------------------------------
    def _release(self) -> ReleaseData:
        data = load_release(self.resolve_path(self.require("release_csv")))
        self.release_data = data
        for line in data.irregularities:
            self.build_log.append(f"release irregularity: {line}")
        return data

    def _release_meta(self, rt: ReleaseTurn) -> Dict[str, Any]:
        return {"release_turn": rt.turn, "topic": rt.topic, "capability": rt.capability,
                "release_pif": dict(rt.reported_pif)}

    def _from_release_only(self) -> List[Dict[str, Any]]:
        data = self._release()
        items: List[Dict[str, Any]] = []
        for cid, rts in data.chats.items():
            plan = [_PlannedTurn(rt.question, "", rt.turn, rt.new_instruction,
                                 instruction_prefix(rt.instruction_text) if rt.instruction_text else "",
                                 self._release_meta(rt)) for rt in rts]
            items += self._emit(cid, plan, [], {"source": "release_only"}, data.texts)
        return items

    def _from_release(self) -> List[Dict[str, Any]]:
        data = self._release()
        chats, mmdu_file, folder = self._mmdu_chats()
        skip = self._flag("skip_unmatched")
        check = self._flag("check_images", True)
        index: Dict[str, List[Tuple[int, int]]] = {}
        for ci, chat in enumerate(chats):
            for tj, (text, _) in enumerate(chat.turns):
                index.setdefault(question_key(text), []).append((ci, tj))
        items: List[Dict[str, Any]] = []
        for cid, rts in data.chats.items():
            votes = Counter(ci for rt in rts for ci, _ in index.get(question_key(rt.question), []))
            if not votes:
                if not skip:
                    raise chat_error(f"question {rts[0].question[:80]!r} matches no MMDU chat", cid, rts[0].turn,
                                     file=self.config.get("release_csv"))
                self._skip("unmatched_rows", f"release chat {cid}: no MMDU chat matches; {len(rts)} rows skipped")
                self.skipped["unmatched_rows"] += len(rts) - 1
                continue
            best = max(votes.items(), key=lambda kv: (kv[1], -kv[0]))[0]
            chat = chats[best]
            check_image_tokens(chat, mmdu_file)
            paths = self._resolve_images(chat, folder, mmdu_file)
            bad = self._bad_images(paths) if check else []
            if bad:
                raise chat_error(f"MMDU chat {chat.chat_id} has unreadable images {bad}", cid, file=mmdu_file)
            plan: List[_PlannedTurn] = []
            last = -1
            for rt in rts:
                key = question_key(rt.question)
                ti = next((i for i in range(last + 1, len(chat.turns))
                           if question_key(chat.turns[i][0]) == key), None)
                if ti is None:
                    if not skip:
                        raise chat_error(f"question {rt.question[:80]!r} not found in MMDU chat {chat.chat_id}",
                                         cid, rt.turn, file=self.config.get("release_csv"))
                    self._skip("unmatched_rows", f"release chat {cid} turn {rt.turn}: no MMDU match; skipped")
                    continue
                # image introductions in MMDU turns the release leaves out move to this turn
                carried = [m.group(0) for j in range(last + 1, ti) for m in _INTRO_RE.finditer(chat.turns[j][0])]
                if carried:
                    self.build_log.append(f"release chat {cid} turn {rt.turn}: image introductions of skipped "
                                          f"MMDU turns carried into this question")
                text = " ".join(carried + [chat.turns[ti][0]]).replace(MMDU_IMAGE_TOKEN, IMAGE_TOKEN)
                meta = self._release_meta(rt)
                meta["mmdu_turn"] = ti + 1
                plan.append(_PlannedTurn(text, chat.turns[ti][1], rt.turn, rt.new_instruction,
                                         instruction_prefix(rt.instruction_text) if rt.instruction_text else "",
                                         meta))
                last = ti
            if not plan:
                continue
            n_img = sum(p.user_text.count(IMAGE_TOKEN) for p in plan)
            items += self._emit(cid, plan, paths[:n_img], {"source": "release", "mmdu_id": chat.chat_id}, data.texts)
        return items
