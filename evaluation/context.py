"""What to do with a sample whose prompt does not fit the model context (issue 12 section 4).

``--context_policy``:

* ``error`` (default): stop with one line naming the sample (chat and turn for multi-turn
  benchmarks) and the lengths;
* ``truncate_history``: drop the oldest complete exchanges (a human turn and the assistant
  turn after it) until the prompt fits. Nothing the scoring depends on is lost: the image
  placeholders of dropped turns move to the first kept turn (every image stays, in order),
  and every instruction sentence a dropped human turn carried (``"Instruction: ..."``, the
  MMMT-IF way, see ``build.mmmt_if``) is restated there, because the PIF checkers still hold
  the model to it. The sample keeps a ``context`` entry saying what was dropped;
* ``skip``: the sample is not run; its record carries ``"skipped": "<reason>"`` and the
  metrics exclude it and show the count (``metrics.evaluate``).

The decision is a pure function of the sample, the preprocessor and the interface's token
counter (``max_context_tokens()`` / ``count_prompt_tokens(images, prompt)`` /
``answer_reserve_tokens(...)`` on the model interface), so a resumed run makes exactly the
same decisions. An interface that cannot count tokens (an API) returns None and every
sample passes unchanged.
"""
from __future__ import annotations

import re
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..build.mmmt_if_instructions import split_instruction_prefix
from ..utils.schema import IMAGE_TOKEN
from ..utils.errors import ReformError
from ..utils.predictions import make_record

CONTEXT_POLICIES = ("error", "truncate_history", "skip")

#: a leading "Instruction: <sentence>" (fallback when the text is no known MMMT-IF instruction)
_INSTRUCTION_RE = re.compile(r"^\s*Instruction:\s*.+?[.!?](?=\s|$)", re.IGNORECASE | re.DOTALL)


def leading_instructions(text: str) -> Tuple[List[str], str]:
    """Split the ``"Instruction: ..."`` sentences at the start of a human turn from the rest:
    (instruction sentences as written, remaining text)."""
    found: List[str] = []
    rest = text
    while rest.lstrip().lower().startswith("instruction:"):
        stripped = rest.lstrip()
        sentence = None
        try:
            iid, after = split_instruction_prefix(stripped)
            if iid is not None:
                sentence = stripped[:len(stripped) - len(after)].strip()
                rest = after
        except ReformError:
            pass
        if sentence is None:
            m = _INSTRUCTION_RE.match(stripped)
            if not m:
                break
            sentence = m.group(0).strip()
            rest = stripped[m.end():]
        found.append(sentence)
    return found, rest


def where(sample: Dict[str, Any]) -> str:
    """How errors name a sample: its id, and chat/turn when the benchmark has them."""
    meta = sample.get("meta") or {}
    parts = [f"sample {sample.get('sample_id')}"]
    if isinstance(meta, dict) and meta.get("chat_id") is not None:
        parts.append(f"chat {meta['chat_id']}")
        if meta.get("turn") is not None:
            parts.append(f"turn {meta['turn']}")
    return ", ".join(parts)


def _exchanges(history: Sequence[Dict[str, Any]]) -> List[List[Dict[str, Any]]]:
    """The history as complete exchanges: each starts at a human turn and holds the turns up
    to the next human turn (normally one assistant answer)."""
    out: List[List[Dict[str, Any]]] = []
    for turn in history:
        if turn.get("from") == "human" or not out:
            out.append([turn])
        else:
            out[-1].append(turn)
    return out


def truncated(sample: Dict[str, Any], n_drop: int) -> Dict[str, Any]:
    """``sample`` without its ``n_drop`` oldest exchanges; their image placeholders and
    instruction sentences are carried to the first kept human turn (or the question)."""
    exchanges = _exchanges(sample.get("history") or [])
    dropped, kept = exchanges[:n_drop], exchanges[n_drop:]
    instructions: List[str] = []
    n_images = 0
    dropped_ids: List[str] = []
    for ex in dropped:
        for turn in ex:
            value = str(turn.get("value", ""))
            n_images += value.count(IMAGE_TOKEN)
            if turn.get("from") == "human":
                instructions.extend(leading_instructions(value)[0])
            elif turn.get("source_sample_id") is not None:
                dropped_ids.append(str(turn["source_sample_id"]))
    history = [dict(t) for ex in kept for t in ex]
    question = str(sample.get("question", ""))
    target_text = history[0]["value"] if history else question
    visible = " ".join([target_text] + [t["value"] for t in history[1:]] + [question])
    restated = [s for s in instructions if s not in visible]
    carried = "".join(s + " " for s in restated) + IMAGE_TOKEN * n_images
    if carried:
        # the dropped turns' image placeholders go in front of the kept text: the images keep
        # their order (they appear in the prompt in the order of the sample's image list)
        new_text = carried + ("\n" if n_images else "") + target_text
        if history:
            history[0] = {**history[0], "value": new_text}
        else:
            question = new_text
    out = dict(sample)
    out["history"] = history
    out["question"] = question
    out["context"] = {"policy": "truncate_history", "dropped_turns": len(dropped),
                      "dropped_messages": sum(len(ex) for ex in dropped),
                      "dropped_sample_ids": dropped_ids, "restated_instructions": restated,
                      "carried_images": n_images}
    return out


def fit_sample(sample: Dict[str, Any], preprocessor: Callable[[Dict[str, Any]], Any], interface: Any,
               policy: str, inference_method: str = "generation",
               gen_kwargs: Optional[Dict[str, Any]] = None) -> Tuple[Dict[str, Any], Any, Optional[str]]:
    """Apply ``policy`` to one sample: ``(sample to run, its prompt, skip reason or None)``.

    Raises ReformError under ``error`` (and for an unknown policy)."""
    if policy not in CONTEXT_POLICIES:
        raise ReformError(f"unknown --context_policy '{policy}'; valid names: {', '.join(CONTEXT_POLICIES)}")
    prompt = preprocessor(sample)
    limit = interface.max_context_tokens()
    if limit is None or (policy == "error" and not sample.get("history")):
        # a single-turn prompt under ``error`` is checked by the model's own forward (the
        # same one-line error naming the sample), which spares a second image preprocessing
        return sample, prompt, None
    reserve = int(interface.answer_reserve_tokens(inference_method, sample, gen_kwargs or {}))
    n = interface.count_prompt_tokens(sample.get("images") or [], prompt)
    if n is None or n + reserve <= limit:
        return sample, prompt, None
    what = (f"{where(sample)}: prompt is {n} tokens + {reserve} reserved for the answer = {n + reserve}, "
            f"longer than the model context of {limit} tokens")
    if policy == "error":
        raise ReformError(f"{what}; pass --context_policy truncate_history (drop the oldest turns) or skip")
    if policy == "skip":
        return sample, None, f"context: prompt of {n} tokens + {reserve} for the answer > {limit}"
    n_exchanges = len(_exchanges(sample.get("history") or []))
    for k in range(1, n_exchanges + 1):
        cand = truncated(sample, k)
        cprompt = preprocessor(cand)
        m = interface.count_prompt_tokens(cand.get("images") or [], cprompt)
        if m is not None and m + reserve <= limit:
            cand["context"].update(prompt_tokens=m, original_prompt_tokens=n, limit=limit, reserve=reserve)
            return cand, cprompt, None
    return sample, None, (f"context: prompt of {n} tokens + {reserve} for the answer > {limit} even "
                          "without any earlier turn")


def fit_batch(batch: Sequence[Dict[str, Any]], preprocessor: Callable[[Dict[str, Any]], Any], interface: Any,
              policy: str, inference_method: str = "generation", gen_kwargs: Optional[Dict[str, Any]] = None,
              finish: Optional[Callable[[Dict[str, Any], Dict[str, Any]], Dict[str, Any]]] = None
              ) -> Tuple[List[Dict[str, Any]], List[Any], List[Dict[str, Any]]]:
    """``fit_sample`` over a batch: (samples to run, their prompts, records of skipped samples).

    ``finish(sample, record) -> record`` completes a skipped sample's record the way the
    caller completes every other record (model label, sample fingerprint, ...)."""

    run, prompts, skipped = [], [], []
    for s in batch:
        used, prompt, reason = fit_sample(s, preprocessor, interface, policy, inference_method, gen_kwargs)
        if reason is not None:
            rec = make_record(used, "", None)
            rec["skipped"] = reason
            skipped.append(finish(s, rec) if finish is not None else rec)
        else:
            run.append(used)
            prompts.append(prompt)
    return run, prompts, skipped
