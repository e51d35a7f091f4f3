"""The contract every model interface implements.

* ``raw_generate(images, prompt, **gen_kwargs) -> str`` (black-box); an interface that counts
  tokens returns ``models.outputs.finish_text(text, tokens=n)``, a ``str`` that carries the count
* ``raw_predict(images, prompt, candidates) -> list[CandidateScore]`` (white-box): per
  candidate the *summed* log-probability of its tokens given the prompt and the number of
  tokens scored. Normalisation (``likelihood_reduction``) happens in metrics, never here.
* batch versions ``raw_batch_generate`` / ``raw_batch_predict`` (default: loop), and one
  ``forward`` that dispatches on the inference method.

``prompt`` is whatever the interface's preprocessor produced: a dialogue string with
``utils.schema.IMAGE_TOKEN`` placeholders, or a list of chat messages.
"""
from __future__ import annotations

from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple

from PIL import Image

from .. import check_option_values
from ...utils.errors import ReformError


class CandidateScore(NamedTuple):
    """Summed log-probability of a candidate's tokens and how many tokens were scored."""

    logprob: float
    num_tokens: int


class BaseInterface:
    """Base class for model interfaces. Subclasses implement ``raw_generate``/``raw_predict``
    or, for efficiency, the batch versions."""

    #: registry name (set by ``models.register_model``)
    name: str = ""
    #: False for black-box models (APIs): likelihood raises a clear error
    supports_likelihood: bool = True
    #: False for a family that computes nothing on a torch device (baselines, APIs): the engine
    #: then picks no device and never imports torch for it
    runs_on_device: bool = True
    #: True for a family that cannot run without an image (BLIP-2 always encodes pixels; PaliGemma's
    #: processor requires images): ``--image_ablation none`` gives it a blank image instead
    needs_image: bool = False
    #: ``--model_option`` keys this class reads (a subclass adds its own; ``models.model_option_names``
    #: collects them over the class hierarchy, and any other key is an error listing them)
    #: (prompt options that only some families read, ``preprocessor`` and ``roles``, are declared by those)
    option_names: Tuple[str, ...] = ("system_msg", "response_prefix", "max_new_tokens")
    #: run_eval flags this family reads (``--model_name``, ``--model_type`` as a variant label that joins
    #: the run identity, ``--half_evaluation``); any other is refused by ``models.check_run_flags``
    run_flags: Tuple[str, ...] = ("model_name", "model_type", "half_evaluation")

    @classmethod
    def check_installed(cls) -> None:
        """Raise ReformError (one line: what to install) when the engine this family runs on is
        missing from this Python; called before any work (``models.check_installed``)."""

    def __init__(self, config: Optional[Dict[str, Any]] = None) -> None:
        self.config: Dict[str, Any] = dict(config or {})
        check_option_values(self.config)  # a Python caller's options are bounded as the CLI's are

    def stop_retrying(self, stopping: bool = True) -> None:
        """The run is stopping (``True``: a call failed for good): a family that retries requests
        starts no new attempt (``openai_api``); ``False``: a new run begins. Nothing here."""

    # -- single-sample API ---------------------------------------------------------
    def raw_generate(self, images: Sequence[Image.Image], prompt: Any, **gen_kwargs: Any) -> str:
        return self.raw_batch_generate([images], [prompt], **gen_kwargs)[0]

    def raw_predict(self, images: Sequence[Image.Image], prompt: Any,
                    candidates: Sequence[str]) -> List[CandidateScore]:
        return self.raw_batch_predict([images], [prompt], [candidates])[0]

    # -- batch API ---------------------------------------------------------------------
    def raw_batch_generate(self, images_list: Sequence[Sequence[Image.Image]], prompts: Sequence[Any],
                           **gen_kwargs: Any) -> List[str]:
        if type(self).raw_generate is BaseInterface.raw_generate:
            raise NotImplementedError(f"{type(self).__name__} implements neither raw_generate "
                                      "nor raw_batch_generate")
        return [self.raw_generate(im, p, **gen_kwargs) for im, p in zip(images_list, prompts)]

    def raw_batch_predict(self, images_list: Sequence[Sequence[Image.Image]], prompts: Sequence[Any],
                          candidates_list: Sequence[Sequence[str]]) -> List[List[CandidateScore]]:
        if not self.supports_likelihood:
            raise ReformError(f"model '{self.name}' is black-box: likelihood needs a white-box model; "
                              "use --infer_method generation")
        if type(self).raw_predict is BaseInterface.raw_predict:
            raise NotImplementedError(f"{type(self).__name__} implements neither raw_predict "
                                      "nor raw_batch_predict")
        return [self.raw_predict(im, p, c) for im, p, c in zip(images_list, prompts, candidates_list)]

    # -- dispatch ------------------------------------------------------------------------
    def forward(self, inference_method: str, samples: Sequence[Dict[str, Any]], prompts: Sequence[Any],
                **gen_kwargs: Any) -> List[Any]:
        """Run one batch. Returns generated strings, or per-sample candidate score lists.

        ``samples`` are the unified samples (with loaded images) the prompts were built from;
        baselines use them to know the answer vocabulary.
        """
        images_list = [s["images"] for s in samples]
        if inference_method == "generation":
            return self.raw_batch_generate(images_list, prompts, **gen_kwargs)
        if inference_method == "likelihood":
            if not self.supports_likelihood:
                raise ReformError(f"model '{self.name}' is black-box: likelihood needs a white-box model; "
                                  "use --infer_method generation")
            cands = []
            for s in samples:
                if not s.get("candidates"):
                    raise ReformError(f"sample {s.get('sample_id')}: no 'candidates' to score by likelihood")
                cands.append(s["candidates"])
            return self.raw_batch_predict(images_list, prompts, cands)
        raise ReformError(f"unknown inference method '{inference_method}'; valid names: generation, likelihood")

    # -- context length (evaluation.context applies --context_policy with these) -------------
    def max_context_tokens(self) -> Optional[int]:
        """The model context in tokens, or None when unknown (then no sample is cut or
        skipped). Config ``max_context_tokens`` sets it (APIs: the served model's limit)."""
        value = self.config.get("max_context_tokens")
        return int(value) if value else None

    def count_prompt_tokens(self, images: Sequence[Any], prompt: Any) -> Optional[int]:
        """Tokens the model would see for ``prompt`` with ``images`` (image tokens expanded),
        or None when this interface cannot count them."""
        return None

    def answer_reserve_tokens(self, inference_method: str, sample: Dict[str, Any],
                              gen_kwargs: Dict[str, Any]) -> int:
        """Tokens to keep free after the prompt: the answer's budget (generation) or the
        longest candidate (likelihood)."""
        return 0

    def resume_from(self, records: Sequence[Dict[str, Any]], world_size: int = 1) -> None:
        """Told of the records this run already holds before it goes on (an earlier, interrupted
        process's answers) and how many ranks share the run: an interface whose limits span the
        run (a token budget) counts them and takes its share."""

    # -- one call at a time (endpoints) --------------------------------------------------------
    def max_in_flight(self) -> int:
        """How many calls this interface runs at once when given them one at a time (``call``).
        1 (the default): the engine hands it batches instead, as an in-process model computes a
        batch at once; an endpoint client returns its concurrency, and the engine then keeps
        that many calls in flight across the whole run (``evaluation.window``)."""
        return 1

    def call(self, inference_method: str, sample: Dict[str, Any], prompt: Any, **gen_kwargs: Any) -> Tuple[Any, Any]:
        """One sample's call in the calling thread (an endpoint's window worker): ``(output,
        trace)``, output as ``forward`` returns it per sample, trace as ``take_traces``."""
        seed = gen_kwargs.pop("seed", None)
        if seed is not None:
            gen_kwargs["seeds"] = [seed]
        out = self.forward(inference_method, [sample], [prompt], **gen_kwargs)[0]
        traces = self.take_traces()
        return out, traces[0] if traces else None

    def close(self) -> None:
        """Release what the interface holds for the run (worker threads, connections)."""

    # -- provenance: what can change an answer (docs/provenance.md) -----------------------------
    def provenance(self) -> Dict[str, Any]:
        """Run-level facts that can change an answer, JSON-ready; unknown values are None."""
        pre = getattr(self, "preprocessor", None)
        return {"engine": "baseline" if not self.runs_on_device else None,
                "preprocessor": type(pre).__name__ if pre is not None else None,
                "system_line": getattr(pre, "system_msg", None)}

    def take_traces(self) -> Optional[List[Dict[str, Any]]]:
        """Per-sample traces of the last ``forward`` (aligned with its samples), then forgotten:
        ``prompt_sha`` (sha256[:16] of the exact text or messages the model or server got),
        ``prompt_text``, ``prompt_tokens``, ``bos`` (does it start with BOS), ``pixel_sha`` (hash
        of the pixel tensors the model got; None without images). None: not traced."""
        return None

    def describe(self) -> Dict[str, Any]:
        """What identifies this model in result files and the output hash."""
        return {"model": self.name, "model_name": self.config.get("model_name"),
                "model_type": self.config.get("model_type")}
