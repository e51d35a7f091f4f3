"""LLaVA-OneVision (``llava-hf/llava-onevision-qwen2-*-ov-hf``): SigLIP tower + Qwen2 LM.

Why thin: the processor expands each ``<image>`` into any-resolution tile features (up to
``anyres_max_9``, pooled when the grid is large) and the model reads ``image_sizes``; the
prompt is the checkpoint's ChatML chat template. Real checkpoints also carry a video
processor, which needs ``torchvision``; image-only tiny checkpoints load without it.
"""
from __future__ import annotations

import logging
from typing import Any, Dict

from .. import register_model
from ..hf_base import HFBaseInterface
from ..tiny import register_tiny_builder, train_tiny_tokenizer
from ..tiny_zoo import (TEXT_SIZES, VISION_SIZES, chat_template_preprocessor, image_only_video_processor,
                             save_checkpoint, seeded_model, tiny_text_config)

logger = logging.getLogger(__name__)

#: LLaVA-OneVision's ChatML template, ``<image>`` where each image goes
ONEVISION_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% for c in message['content'] %}{% if c['type'] == 'image' %}<image>\n"
    "{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}{% endfor %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@register_model("llava_onevision")
class LlavaOnevisionInterface(HFBaseInterface):
    """LLaVA-OneVision: any-resolution tiles, ChatML prompts."""

    family = "llava_onevision"
    model_types = ("llava_onevision",)

    def make_preprocessor(self, config: Dict[str, Any]) -> Any:
        return chat_template_preprocessor(self, config)


def build_tiny_llava_onevision(out_dir: str, size: str = "tiny") -> None:
    """Random LlavaOnevisionForConditionalGeneration (SigLIP + Qwen2) with a 2x2 tile grid."""
    from transformers import (LlavaOnevisionConfig, LlavaOnevisionForConditionalGeneration,
                              LlavaOnevisionProcessor, Qwen2Config, SiglipVisionConfig)
    from transformers.models.llava_onevision.image_processing_pil_llava_onevision import (
        LlavaOnevisionImageProcessorPil)

    t, v = TEXT_SIZES[size], VISION_SIZES[size]
    tok = train_tiny_tokenizer(vocab_size=t["vocab"], extra_special=("<image>", "<video>", "<|im_start|>",
                                                                      "<|im_end|>"))
    side = v["image"]
    pinpoints = [[side, side], [side, 2 * side], [2 * side, side], [2 * side, 2 * side]]
    text_cfg = tiny_text_config(Qwen2Config, tok, t)
    vision_cfg = SiglipVisionConfig(hidden_size=v["hidden"], intermediate_size=v["mlp"],
                                    num_hidden_layers=v["layers"], num_attention_heads=v["heads"],
                                    image_size=side, patch_size=v["patch"])
    config = LlavaOnevisionConfig(vision_config=vision_cfg, text_config=text_cfg,
                                  image_token_index=tok.convert_tokens_to_ids("<image>"),
                                  video_token_index=tok.convert_tokens_to_ids("<video>"),
                                  image_grid_pinpoints=pinpoints, vision_feature_select_strategy="full",
                                  vision_feature_layer=-1, vision_aspect_ratio="anyres_max_9",
                                  tie_word_embeddings=False)
    model = seeded_model(lambda: LlavaOnevisionForConditionalGeneration(config), size)
    image_processor = LlavaOnevisionImageProcessorPil(size={"height": side, "width": side},
                                                      image_grid_pinpoints=pinpoints, do_pad=True)
    processor = LlavaOnevisionProcessor(image_processor=image_processor, tokenizer=tok,
                                        video_processor=image_only_video_processor(),
                                        num_image_tokens=(side // v["patch"]) ** 2,
                                        vision_feature_select_strategy="full",
                                        chat_template=ONEVISION_CHAT_TEMPLATE, image_token="<image>",
                                        video_token="<video>", vision_aspect_ratio="anyres_max_9")
    save_checkpoint(model, processor, tok, out_dir)


register_tiny_builder("llava_onevision", build_tiny_llava_onevision, version="1")
