"""Weight-free baselines: ``random`` and ``constant`` (chance level) and ``reference``.

``random`` and ``constant`` answer from the sample's closed answer vocabulary (its options
or ``candidates``), so they need no model; ``random`` is seeded per (seed, sample_id,
dup_index). ``reference`` answers open questions with the sample's own reference answer
(for MMMT-IF the MMDU answer, written without the format instructions): the score of a
correct answer that ignores the instructions.
"""
from __future__ import annotations

from typing import Any, Dict, List, Sequence

from .. import register_model
from .base_interface import BaseInterface, CandidateScore
from ...utils.errors import ReformError
from ...utils.preprocessors import ConvProcessor
from ...utils.seeding import rng_for


#: a weight-free baseline reads neither a checkpoint nor a prompt
_BASELINE_REFUSED = {k: "a weight-free baseline reads no prompt and generates nothing"
                     for k in ("system_msg", "response_prefix", "max_new_tokens")}


class _Baseline(BaseInterface):
    run_flags = ()
    runs_on_device = False
    refused_options = _BASELINE_REFUSED

    def make_preprocessor(self, config: Dict[str, Any]) -> ConvProcessor:
        return ConvProcessor()

    def pick(self, sample: Dict[str, Any], n: int) -> int:
        raise NotImplementedError

    def forward(self, inference_method: str, samples: Sequence[Dict[str, Any]], prompts: Sequence[Any],
                **gen_kwargs: Any) -> List[Any]:
        out: List[Any] = []
        for s in samples:
            options = s.get("answer_options") if s.get("formulation") == "SingleChoice" else s.get("candidates")
            if inference_method == "likelihood":
                options = s.get("candidates") or options
            if not options:
                raise ReformError(f"sample {s.get('sample_id')}: the '{self.name}' baseline needs a closed "
                                  "answer vocabulary (options or candidates)")
            k = self.pick(s, len(options))
            if inference_method == "likelihood":
                out.append([CandidateScore(0.0 if i == k else -1.0, 1) for i in range(len(options))])
            elif s.get("formulation") == "SingleChoice":
                out.append(f"({s['option_marks'][k]})")
            else:
                out.append(str(options[k]))
        return out


@register_model("random")
class RandomBaseline(_Baseline):
    """Uniform choice over the answer vocabulary, seeded per sample."""

    def pick(self, sample: Dict[str, Any], n: int) -> int:
        seed = int(self.config.get("seed", 0))
        return rng_for(seed, "random-baseline", sample["sample_id"], sample.get("dup_index", 0)).randrange(n)


@register_model("constant")
class ConstantBaseline(_Baseline):
    """Always the first option shown (or the first candidate)."""

    def pick(self, sample: Dict[str, Any], n: int) -> int:
        return 0


@register_model("reference")
class ReferenceBaseline(BaseInterface):
    """Generation: the sample's reference answer (``answer``), verbatim.

    Why: on MMMT-IF this is the PIF of instruction-unaware answers (issue 10 §3). It reads
    the answer from the sample and refuses samples that have none (``release_only`` chats).
    """

    runs_on_device = False

    run_flags = ()
    refused_options = _BASELINE_REFUSED

    def make_preprocessor(self, config: Dict[str, Any]) -> ConvProcessor:
        return ConvProcessor()

    def forward(self, inference_method: str, samples: Sequence[Dict[str, Any]], prompts: Sequence[Any],
                **gen_kwargs: Any) -> List[Any]:
        if inference_method != "generation":
            raise ReformError("the 'reference' baseline answers by generation only; use --infer_method generation")
        out: List[Any] = []
        for s in samples:
            answer = s.get("answer")
            if not isinstance(answer, str) or not answer.strip():
                raise ReformError(f"sample {s.get('sample_id')}: the 'reference' baseline needs a reference "
                                  "answer text in 'answer' (the MMMT-IF release CSV alone has none: use "
                                  "source mmdu or release)")
            out.append(answer)
        return out
