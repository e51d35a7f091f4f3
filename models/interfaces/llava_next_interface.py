"""LLaVA-NeXT (llava-v1.6, ``llava-hf/llava-v1.6-*-hf``): a thin layer over the shared HF base.

Why it differs from LLaVA-1.5 only in its checkpoint type and tiny builder: the processor
expands each ``<image>`` into the any-resolution tile features (base tile + grid tiles +
row newlines) itself, and the model reads the ``image_sizes`` the processor returns; the
conversation format of the Vicuna variants is llava-1.5's. For the Mistral / Llama-3
variants use ``preprocessor: chat_template`` so the checkpoint's own template is applied.
"""
from __future__ import annotations

import logging

from .. import register_model
from .llava_interface import LlavaInterface
from ..tiny import LLAVA_CHAT_TEMPLATE, register_tiny_builder, train_tiny_tokenizer
from ..tiny_zoo import TEXT_SIZES, VISION_SIZES, save_checkpoint, seeded_model, tiny_text_config

logger = logging.getLogger(__name__)


@register_model("llava_next")
class LlavaNextInterface(LlavaInterface):
    """LLaVA-NeXT: any-resolution tiling; same prompt format as llava-1.5 (Vicuna variants)."""

    family = "llava_next"
    model_types = ("llava_next",)


def build_tiny_llava_next(out_dir: str, size: str = "tiny") -> None:
    """Random LlavaNextForConditionalGeneration (CLIP tower + Llama) with a 2x2 tile grid."""
    from transformers import (CLIPVisionConfig, LlamaConfig, LlavaNextConfig,
                              LlavaNextForConditionalGeneration, LlavaNextProcessor)
    from transformers.models.llava_next.image_processing_pil_llava_next import LlavaNextImageProcessorPil

    t, v = TEXT_SIZES[size], VISION_SIZES[size]
    tok = train_tiny_tokenizer(vocab_size=t["vocab"], extra_special=("<image>",))
    side = v["image"]
    pinpoints = [[side, side], [side, 2 * side], [2 * side, side], [2 * side, 2 * side]]
    text_cfg = tiny_text_config(LlamaConfig, tok, t)
    vision_cfg = CLIPVisionConfig(hidden_size=v["hidden"], intermediate_size=v["mlp"],
                                  num_hidden_layers=v["layers"], num_attention_heads=v["heads"],
                                  image_size=side, patch_size=v["patch"], projection_dim=v["hidden"])
    config = LlavaNextConfig(vision_config=vision_cfg, text_config=text_cfg,  # type: ignore[call-arg]  # transformers' config stubs omit what its **kwargs take
                             image_token_id=tok.convert_tokens_to_ids("<image>"),
                             image_grid_pinpoints=pinpoints, vision_feature_select_strategy="default",
                             vision_feature_layer=-2, pad_token_id=tok.pad_token_id, tie_word_embeddings=False)
    model = seeded_model(lambda: LlavaNextForConditionalGeneration(config), size)
    image_processor = LlavaNextImageProcessorPil(size={"shortest_edge": side},
                                                 crop_size={"height": side, "width": side},
                                                 image_grid_pinpoints=pinpoints)
    processor = LlavaNextProcessor(image_processor=image_processor, tokenizer=tok, patch_size=v["patch"],
                                   vision_feature_select_strategy="default", chat_template=LLAVA_CHAT_TEMPLATE,
                                   image_token="<image>", num_additional_image_tokens=1)
    save_checkpoint(model, processor, tok, out_dir)


register_tiny_builder("llava_next", build_tiny_llava_next, version="1")
