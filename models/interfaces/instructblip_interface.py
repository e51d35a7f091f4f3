"""InstructBLIP (``Salesforce/instructblip-vicuna-*``, ``Salesforce/instructblip-flan-t5-*``).

Why a subclass of BLIP-2's interface: the architecture is BLIP-2's plus one input, the
instruction text fed to the Q-Former (``qformer_input_ids``, its own BERT tokenizer), so
the query outputs depend on the question. Everything else (query-token runs at each image
placeholder, candidates on the language model from the prefix cache for Vicuna, on the
decoder for Flan-T5) is inherited; see ``blip2_interface``.

Multi-image: each image gets its own Q-Former pass with the *same* instruction (the
rendered prompt with image placeholders removed), one ``qformer_input_ids`` row per image.
"""
from __future__ import annotations

import logging
from typing import Dict, List, Tuple

import torch

from .. import register_model
from .blip2_interface import (Blip2Interface, blip_image_processor, blip_text_config,
                                               blip_vision_qformer)
from ..tiny import register_tiny_builder, train_tiny_tokenizer
from ..tiny_zoo import TEXT_SIZES, save_checkpoint, seeded_model

logger = logging.getLogger(__name__)


@register_model("instructblip")
class InstructBlipInterface(Blip2Interface):
    """InstructBLIP: BLIP-2 whose Q-Former also reads the instruction."""

    family = "instructblip"
    model_types = ("instructblip",)

    def default_roles(self) -> Tuple[str, str]:
        """InstructBLIP's short-answer VQA template (paper, appendix instruction templates:
        ``<Image>Question: {} Short answer:``), for the Vicuna and Flan-T5 checkpoints alike."""
        return ("Question", "Short answer")

    def _qformer_inputs(self, texts: List[str], counts: List[int]) -> Dict[str, torch.Tensor]:
        """One Q-Former text row per image: its prompt's text without image placeholders."""
        qtok = self.processor.qformer_tokenizer
        limit = int(getattr(self.model.config.qformer_config, "max_position_embeddings", 512))
        rows = [" ".join(t.replace(self.image_token, " ").split()) for t, c in zip(texts, counts) for _ in range(c)]
        enc = qtok(rows, padding=True, truncation=True, max_length=limit, return_tensors="pt")
        return {"qformer_input_ids": enc["input_ids"].to(self.device),
                "qformer_attention_mask": enc["attention_mask"].to(self.device)}


def _build_instructblip(out_dir: str, size: str, seq2seq: bool) -> None:
    from transformers import (InstructBlipConfig, InstructBlipForConditionalGeneration,
                              InstructBlipProcessor)

    tok = train_tiny_tokenizer(vocab_size=TEXT_SIZES[size]["vocab"], extra_special=("<image>",))
    qtok = train_tiny_tokenizer(vocab_size=TEXT_SIZES[size]["vocab"], extra_special=())
    qtok.padding_side = "right"
    parts = blip_vision_qformer(size)
    config = InstructBlipConfig(vision_config=parts["vision"], qformer_config=parts["qformer"],
                                text_config=blip_text_config(tok, size, seq2seq).to_dict(),
                                num_query_tokens=parts["num_query"],
                                image_token_index=tok.convert_tokens_to_ids("<image>"))
    model = seeded_model(lambda: InstructBlipForConditionalGeneration(config), size)
    processor = InstructBlipProcessor(image_processor=blip_image_processor(size), tokenizer=tok,
                                      qformer_tokenizer=qtok, num_query_tokens=parts["num_query"])
    save_checkpoint(model, processor, tok, out_dir)


def build_tiny_instructblip(out_dir: str, size: str = "tiny") -> None:
    """Random InstructBlipForConditionalGeneration with an OPT (decoder-only) language model
    (Vicuna checkpoints are Llama; the decoder-only code path is the same)."""
    _build_instructblip(out_dir, size, seq2seq=False)


def build_tiny_instructblip_t5(out_dir: str, size: str = "tiny") -> None:
    """Random InstructBlipForConditionalGeneration with a T5 encoder-decoder language model."""
    _build_instructblip(out_dir, size, seq2seq=True)


register_tiny_builder("instructblip", build_tiny_instructblip, version="1")
register_tiny_builder("instructblip_t5", build_tiny_instructblip_t5, version="1")
