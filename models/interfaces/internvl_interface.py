"""InternVL 2.5 / 3 in native transformers format (``OpenGVLab/InternVL3-*-hf``), no remote code.

Why thin: the processor crops each image into up to ``max_patches`` tiles plus a thumbnail
and expands the template's ``<IMG_CONTEXT>`` into ``<img><IMG_CONTEXT>*n</img>`` per tile;
the prompt is the checkpoint's ChatML chat template. Original ``OpenGVLab/InternVL2-*``
repositories (remote code) are not this format: see docs/adding_a_model.md.
Real checkpoints carry a video processor, which needs ``torchvision``.
"""
from __future__ import annotations

import logging
from typing import Any, Dict, List, Optional, Sequence

from .. import register_model
from ..hf_base import HFBaseInterface
from ..tiny import register_tiny_builder, train_tiny_tokenizer
from ..tiny_zoo import (TEXT_SIZES, VISION_SIZES, chat_template_preprocessor, image_only_video_processor,
                             save_checkpoint, seeded_model, tiny_text_config)

logger = logging.getLogger(__name__)

INTERNVL_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% for c in message['content'] %}{% if c['type'] == 'image' %}<IMG_CONTEXT>\n"
    "{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}{% endfor %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
INTERNVL_TOKENS = {"start_image_token": "<img>", "end_image_token": "</img>",
                   "context_image_token": "<IMG_CONTEXT>", "video_token": "<video>"}


@register_model("internvl")
class InternVLInterface(HFBaseInterface):
    """InternVL (-hf format): InternViT tower, pixel-shuffle MLP projector, Qwen2 / InternLM LM."""

    family = "internvl"
    model_types = ("internvl",)

    def make_preprocessor(self, config: Dict[str, Any]) -> Any:
        return chat_template_preprocessor(self, config)

    def pixel_tiles(self, enc: Any, counts: Sequence[int]) -> Optional[List[int]]:
        """The processor stacks every image's tiles and drops their count; each tile became
        ``image_seq_length`` context tokens of its row, so a row's tiles are counted there."""
        ids, per_tile = enc.get("input_ids"), getattr(self.processor, "image_seq_length", None)
        token = getattr(self.processor, "image_token_id", None)
        if ids is None or not per_tile or token is None:
            return None
        return [int((row == token).sum()) // int(per_tile) for row in ids]


def build_tiny_internvl(out_dir: str, size: str = "tiny") -> None:
    """Random InternVLForConditionalGeneration (InternViT + Qwen2), up to 4 tiles per image."""
    from transformers import (InternVLConfig, InternVLForConditionalGeneration, InternVLProcessor,
                              PreTrainedTokenizerFast, Qwen2Config)
    from transformers.models.got_ocr2.image_processing_pil_got_ocr2 import GotOcr2ImageProcessorPil
    from transformers.models.internvl.configuration_internvl import InternVLVisionConfig

    t, v = TEXT_SIZES[size], VISION_SIZES[size]
    base = train_tiny_tokenizer(vocab_size=t["vocab"], extra_special=(*INTERNVL_TOKENS.values(),
                                                                       "<|im_start|>", "<|im_end|>"))
    # the processor reads its image tokens from named tokenizer attributes
    tok = PreTrainedTokenizerFast(tokenizer_object=base._tokenizer, bos_token="<s>", eos_token="</s>",
                                  unk_token="<unk>", pad_token="<pad>", padding_side="left",
                                  model_max_length=4096, extra_special_tokens=INTERNVL_TOKENS)
    side, ratio = v["image"], 0.5
    seq_len = int((side // v["patch"]) ** 2 * ratio ** 2)
    text_cfg = tiny_text_config(Qwen2Config, tok, t)
    vision_cfg = InternVLVisionConfig(hidden_size=v["hidden"], intermediate_size=v["mlp"],
                                      num_hidden_layers=v["layers"], num_attention_heads=v["heads"],
                                      image_size=(side, side), patch_size=(v["patch"], v["patch"]))
    config = InternVLConfig(vision_config=vision_cfg, text_config=text_cfg,
                            image_token_id=tok.convert_tokens_to_ids("<IMG_CONTEXT>"),  # type: ignore[arg-type]  # one token: one id
                            image_seq_length=seq_len, downsample_ratio=ratio, tie_word_embeddings=False)
    model = seeded_model(lambda: InternVLForConditionalGeneration(config), size)
    image_processor = GotOcr2ImageProcessorPil(size={"height": side, "width": side}, crop_to_patches=True,
                                               min_patches=1, max_patches=4)
    processor = InternVLProcessor(image_processor=image_processor, tokenizer=tok,
                                  video_processor=image_only_video_processor(), image_seq_length=seq_len,
                                  chat_template=INTERNVL_CHAT_TEMPLATE)
    save_checkpoint(model, processor, tok, out_dir)


register_tiny_builder("internvl", build_tiny_internvl, version="1")
