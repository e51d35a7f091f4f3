"""PaliGemma 1/2 (``google/paligemma-3b-*``, ``google/paligemma2-*``): SigLIP + Gemma, prefix-LM.

Why this family needs care: PaliGemma attends *bidirectionally* within the prefix (images +
prompt, ``token_type_ids`` 0) and causally over the suffix (the answer, ``token_type_ids``
1). The HF processor writes ``<image>*n ... <bos>prompt\\n`` (BOS after the last image, a
newline closing the prefix) and returns ``token_type_ids`` 0 for all of it.

* **Cached scoring:** the prefix pass runs with ``token_type_ids`` (bidirectional prefix);
  the candidate pass runs from the cache without them, which the model treats as causal
  suffix tokens that see the whole prefix: exactly the prefix-LM split.
* **Full-sequence reference:** the candidate tokens get ``token_type_ids`` 1
  (``candidate_token_type`` hook in ``hf_base``), so prefix tokens never attend to the
  candidate; both paths agree within 1e-4 (tested).
* **Candidate tokens:** the prompt as the model sees it ends with ``"\\n"``, so candidates are
  joined with no space: ``tokens(prompt + "\\n" + candidate)`` minus ``tokens(prompt + "\\n")``.
* **Multi-image:** the processor and model take any number of images per prompt (each
  ``<image>`` becomes ``image_seq_length`` tokens, scattered in order); PaliGemma was trained
  with one. The preprocessor puts all images in front of the prompt, as the processor expects.
* Positions are 1-indexed and computed by the model, so candidates use the ``expand`` strategy.
"""
from __future__ import annotations

import logging
from typing import Any, Callable, Dict, List, Optional

from ...utils.schema import IMAGE_TOKEN
from .. import register_model
from ..hf_base import HFBaseInterface
from ..tiny import register_tiny_builder, train_tiny_tokenizer
from ..tiny_zoo import TEXT_SIZES, VISION_SIZES, save_checkpoint, seeded_model
from ...utils.preprocessors import ConvProcessor, compose_query, parse_roles

logger = logging.getLogger(__name__)


#: the VQA task prefix of PaliGemma's pretraining and mix checkpoints (model card, big_vision)
PALIGEMMA_TASK = "answer en"


class TaskPrefixProcessor:
    """PaliGemma's documented prompt: ``<task prefix> <instruction + question>`` (the processor
    adds BOS before it and the closing ``"\\n"``). PaliGemma is not a chat model: earlier turns,
    if any, go before it one per line (outside its training)."""

    def __init__(self, task: str = PALIGEMMA_TASK, response_prefix: Optional[str] = None) -> None:
        self.task = task
        self.response_prefix = response_prefix

    def __call__(self, sample: Dict[str, Any]) -> str:
        lines = [t["value"] for t in sample.get("history", [])]
        query = compose_query(sample)
        lines.append(f"{self.task} {query}" if self.task else query)
        text = "\n".join(lines)
        return f"{text} {self.response_prefix}" if self.response_prefix else text


class AllImagesFirstProcessor:
    """A preprocessor's output with every image placeholder moved to the front (PaliGemma's
    processor places BOS after the last image token)."""

    def __init__(self, inner: Callable[[Dict[str, Any]], str]) -> None:
        self.inner = inner

    def __call__(self, sample: Dict[str, Any]) -> str:
        text = self.inner(sample)
        n = text.count(IMAGE_TOKEN)
        return IMAGE_TOKEN * n + text.replace(IMAGE_TOKEN + "\n", "").replace(IMAGE_TOKEN, "")


@register_model("paligemma")
class PaliGemmaInterface(HFBaseInterface):
    """PaliGemma: SigLIP tower, linear projector, Gemma (1 or 2) text model, prefix-LM mask."""

    family = "paligemma"
    needs_image = True  # the processor refuses a prompt without images
    model_types = ("paligemma",)
    likelihood_strategy = "expand"
    #: Gemma positions are 1-indexed (explicit in a left-padded batched prefix pass)
    position_offset = 1
    #: the processor builds its ``labels`` with ``np.array`` on its outputs, which warns
    #: (DeprecationWarning, numpy 2) when they are torch tensors
    processor_tensors = "np"
    option_names = ("roles",)

    def make_preprocessor(self, config: Dict[str, Any]) -> AllImagesFirstProcessor:
        """Images first, then the task prefix and the question (``answer en ...``; the
        checkpoints have no chat template); ``system_msg`` replaces the task prefix. With
        ``roles``: ``Question: ... Answer:`` turns instead (fine-tuned checkpoints)."""
        prefix = config.get("response_prefix")
        if config.get("roles"):
            return AllImagesFirstProcessor(ConvProcessor(
                roles=parse_roles(config["roles"], ("Question", "Answer")), sep_style="one", seps=(" ",),
                system_msg=config.get("system_msg", ""), response_prefix=prefix))
        return AllImagesFirstProcessor(TaskPrefixProcessor(config.get("system_msg", PALIGEMMA_TASK), prefix))

    def _encode(self, texts: List[str], images: List[Any]) -> Dict[str, Any]:
        """The processor's inputs without the training ``labels`` it adds."""
        enc = super()._encode(texts, images)
        enc.pop("labels", None)
        return enc

    def candidate_token_type(self, key: str) -> int:
        """Candidate tokens are the causal suffix: ``token_type_ids`` 1."""
        return 1 if key == "token_type_ids" else 0

    def candidate_ids(self, prompt_text: str, candidate: str) -> List[int]:
        """The candidate follows the processor's closing ``"\\n"`` directly."""
        return super().candidate_ids(prompt_text + "\n", candidate.lstrip())


def build_tiny_paligemma(out_dir: str, size: str = "tiny") -> None:
    """Random PaliGemmaForConditionalGeneration (SigLIP + Gemma), one 32 px tile per image."""
    from transformers import (GemmaConfig, PaliGemmaConfig, PaliGemmaForConditionalGeneration,
                              PaliGemmaProcessor, SiglipVisionConfig)
    from transformers.models.siglip.image_processing_pil_siglip import SiglipImageProcessorPil

    t, v = TEXT_SIZES[size], VISION_SIZES[size]
    tok = train_tiny_tokenizer(vocab_size=t["vocab"], extra_special=("<image>",))
    side = v["image"]
    image_processor = SiglipImageProcessorPil(size={"height": side, "width": side})
    image_processor.image_seq_length = (side // v["patch"]) ** 2  # type: ignore[attr-defined]  # read by PaliGemmaProcessor; the stub lacks it
    # the processor adds PaliGemma's <loc>/<seg> tokens: size the vocabulary after it
    processor = PaliGemmaProcessor(image_processor=image_processor, tokenizer=tok)
    text_cfg = GemmaConfig(vocab_size=len(tok), hidden_size=t["hidden"], intermediate_size=t["mlp"],
                           num_hidden_layers=t["layers"], num_attention_heads=t["heads"],
                           num_key_value_heads=t["kv"], head_dim=t["hidden"] // t["heads"],
                           max_position_embeddings=4096, bos_token_id=tok.bos_token_id,
                           eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    vision_cfg = SiglipVisionConfig(hidden_size=v["hidden"], intermediate_size=v["mlp"],  # type: ignore[call-arg]  # transformers' config stubs omit what its **kwargs take
                                    num_hidden_layers=v["layers"], num_attention_heads=v["heads"],
                                    image_size=side, patch_size=v["patch"], projection_dim=t["hidden"])
    config = PaliGemmaConfig(vision_config=vision_cfg, text_config=text_cfg, vocab_size=len(tok),
                             image_token_index=tok.convert_tokens_to_ids("<image>"), projection_dim=t["hidden"],
                             hidden_size=t["hidden"], tie_word_embeddings=False)
    model = seeded_model(lambda: PaliGemmaForConditionalGeneration(config), size)
    save_checkpoint(model, processor, tok, out_dir)


register_tiny_builder("paligemma", build_tiny_paligemma, version="1")
