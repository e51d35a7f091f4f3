"""Turn a unified sample into a model's input: a dialogue string or chat messages.

``compose_query`` is the single place that decides what the user sees for the current
question (instruction + question, with options for SingleChoice generation). Images are
``IMAGE_TOKEN`` placeholders: kept where the sample's text already has them, otherwise all
of the sample's images go at the start of the current query.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

from .schema import IMAGE_TOKEN
from .errors import ReformError

SEP_STYLES = ("one", "two", "plain")


def count_image_tokens(sample: Dict[str, Any], query: str) -> int:
    """How many IMAGE_TOKEN placeholders the history and query hold."""
    return query.count(IMAGE_TOKEN) + sum(t["value"].count(IMAGE_TOKEN) for t in sample.get("history", []))


def compose_query(sample: Dict[str, Any], with_options: Optional[bool] = None) -> str:
    """Instruction and question for the current turn, images placed.

    Options are shown for SingleChoice samples scored by generation (``with_options`` overrides).
    """
    if with_options is None:
        with_options = sample.get("formulation") == "SingleChoice" and sample.get("inference_method") != "likelihood"
    question = sample.get("question_with_option") if with_options and sample.get("question_with_option") else sample.get("question", "")
    if not isinstance(question, str):  # None would crash the count below, or reach the model as 'None'
        raise ReformError(f"sample {sample.get('sample_id')}: field 'question' must be text, "
                          f"got {type(question).__name__}")
    instruct = (sample.get("instruct") or "").strip()
    text = f"{instruct}\n{question}" if instruct else question
    n_images = len(sample.get("images", []))
    placed = count_image_tokens(sample, text)
    if placed == 0 and n_images:
        text = IMAGE_TOKEN * n_images + "\n" + text
    elif placed != n_images:
        raise ReformError(f"sample {sample.get('sample_id')}: {placed} image placeholders in the text "
                          f"but {n_images} images")
    return text


def parse_roles(value: Any, default: Tuple[str, str]) -> Tuple[str, str]:
    """The ``roles`` option as (user role, assistant role): a two-item list, or ``"User,Bot"``
    as ``--model_option roles=User,Bot`` gives it; ``default`` when unset."""
    if value is None or value == "" or value == []:
        return default
    items = [str(r).strip() for r in (value.split(",") if isinstance(value, str) else value)]
    if len(items) != 2 or not all(items):
        raise ReformError(f"--model_option roles: must be two role names, e.g. roles=User,Assistant; got {value!r}")
    return items[0], items[1]


class ConvProcessor:
    """A dialogue-string preprocessor with configurable roles and separators.

    ``sep_style``:
      * ``one``: every message is ``"<Role>: <text>"`` followed by ``seps[0]``;
      * ``two``: human messages end with ``seps[0]`` and assistant messages with ``seps[1]``
        (Vicuna / LLaVA-1.5: ``"USER: ... ASSISTANT: ...</s>"``);
      * ``plain``: messages concatenated with ``seps[0]`` and no roles.
    The prompt ends with the assistant role (and ``response_prefix`` if given), ready for
    the answer. ``system_msg`` starts the prompt.
    """

    def __init__(self, roles: Tuple[str, str] = ("USER", "ASSISTANT"), sep_style: str = "two",
                 seps: Sequence[str] = (" ", "</s>"), system_msg: str = "",
                 response_prefix: Optional[str] = None, options_in_history: bool = True) -> None:
        if sep_style not in SEP_STYLES:
            raise ReformError(f"unknown sep_style '{sep_style}'; valid names: {', '.join(SEP_STYLES)}")
        self.roles = tuple(roles)
        self.sep_style = sep_style
        self.seps = list(seps) if len(seps) > 1 else [seps[0], seps[0]]
        self.system_msg = system_msg
        self.response_prefix = response_prefix
        self.options_in_history = options_in_history

    def messages(self, sample: Dict[str, Any]) -> List[Tuple[str, str]]:
        """(role, text) pairs: the history, then the current query."""
        out = []
        for turn in sample.get("history", []):
            role = self.roles[0] if turn["from"] == "human" else self.roles[1]
            text = turn["value"]
            if not self.options_in_history and turn["from"] == "human" and " Options: " in text:
                text = text.split(" Options: ")[0]
            out.append((role, text))
        out.append((self.roles[0], compose_query(sample)))
        return out

    def __call__(self, sample: Dict[str, Any]) -> str:
        parts: List[str] = []
        if self.system_msg:
            parts.append(self.system_msg + self.seps[0])
        for role, text in self.messages(sample):
            if self.sep_style == "plain":
                parts.append(text + self.seps[0])
            else:
                sep = self.seps[0] if (self.sep_style == "one" or role == self.roles[0]) else self.seps[1]
                parts.append(f"{role}: {text}{sep}")
        if self.sep_style != "plain":
            parts.append(f"{self.roles[1]}:")
        if self.response_prefix:
            parts.append((" " if self.sep_style != "plain" else "") + self.response_prefix)
        return "".join(parts)


class ChatTemplateProcessor:
    """Chat messages for a processor's own chat template, images in place.

    Returns a list of ``{"role": "user"|"assistant", "content": [{"type": "image"} |
    {"type": "text", "text": ...}]}``; the interface applies the template with
    ``add_generation_prompt=True``. ``response_prefix`` is returned separately by
    ``generation_prefix`` and appended after the template by the interface.
    """

    def __init__(self, system_msg: str = "", response_prefix: Optional[str] = None) -> None:
        self.system_msg = system_msg
        self.response_prefix = response_prefix

    @staticmethod
    def _content(text: str) -> List[Dict[str, str]]:
        content: List[Dict[str, str]] = []
        pieces = text.split(IMAGE_TOKEN)
        for i, piece in enumerate(pieces):
            if i > 0:
                content.append({"type": "image"})
            if piece.strip():
                content.append({"type": "text", "text": piece.strip()})
        return content

    def __call__(self, sample: Dict[str, Any]) -> List[Dict[str, Any]]:
        msgs: List[Dict[str, Any]] = []
        if self.system_msg:
            msgs.append({"role": "system", "content": [{"type": "text", "text": self.system_msg}]})
        for turn in sample.get("history", []):
            role = "user" if turn["from"] == "human" else "assistant"
            msgs.append({"role": role, "content": self._content(turn["value"])})
        msgs.append({"role": "user", "content": self._content(compose_query(sample))})
        return msgs
