"""Qwen2-VL and Qwen2.5-VL (``Qwen/Qwen2-VL-*-Instruct``, ``Qwen/Qwen2.5-VL-*-Instruct``).

Why this family needs care: its rotary positions are multimodal (M-RoPE: temporal, height
and width sections; image tokens share a temporal index and take 2-D grid positions, text
after an image resumes at ``max(previous) + 1``). On the prefix pass the model computes
these 3-D positions from ``image_grid_thw`` and stores the offset ``rope_deltas`` between
them and the plain token index (per row; left padding included). Candidates continue at
``real prefix length + rope_deltas`` of their row: ``candidate_positions`` passes these
(all three sections equal, text) explicitly, so candidates can be packed into one row per
sample and batched; a text-only prefix has offset 0 (the model would keep the stale offset
of its last image pass). The zoo test checks cached scores against full-sequence scores for
multi-image prompts, ``tests/test_batching.py`` batched against one-sample scores.

The processor resizes each image to a multiple of ``patch_size * merge_size`` within
``[min_pixels, max_pixels]``; set those through the checkpoint's preprocessor config to
bound the number of visual tokens for 10-image prompts.
"""
from __future__ import annotations

import logging
from typing import Any, Dict

import torch

from .. import register_model
from ..hf_base import HFBaseInterface
from ..tiny import register_tiny_builder, train_tiny_tokenizer
from ..tiny_zoo import (TEXT_SIZES, VISION_SIZES, chat_template_preprocessor, image_only_video_processor,
                             save_checkpoint, seeded_model)

logger = logging.getLogger(__name__)

#: Qwen2-VL's ChatML template with images as <|vision_start|><|image_pad|><|vision_end|>
QWEN2_VL_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for c in message['content'] %}{% if c['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
QWEN_SPECIAL = ("<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
                "<|image_pad|>", "<|video_pad|>")


@register_model("qwen2_vl")
class Qwen2VLInterface(HFBaseInterface):
    """Qwen2-VL / Qwen2.5-VL: native-resolution ViT with 2x2 token merging and M-RoPE."""

    family = "qwen2_vl"
    model_types = ("qwen2_vl", "qwen2_5_vl")
    #: candidates continue from the prefix's M-RoPE offset (``rope_deltas``):
    #: ``candidate_positions`` passes it explicitly, so candidates can be packed
    likelihood_strategy = "packed"
    #: a left-padded prefix pass gets its M-RoPE positions from the model (from the mask)
    position_source = "model"

    def prefix_position_inputs(self, enc: Dict[str, Any], mask: torch.Tensor) -> Dict[str, torch.Tensor]:
        """With images the model computes M-RoPE positions from the mask; a text-only batch
        gets plain positions counted over each row's real tokens (the model would count pads)."""
        if "image_grid_thw" in enc:
            return {}
        return {"position_ids": (mask.long().cumsum(-1) - 1).clamp(min=0)}

    def after_prefix(self, out: Any, enc: Dict[str, Any]) -> None:
        """Keep the prefix pass's per-row M-RoPE offsets (``rope_deltas``, shape (batch, 1));
        0 for a text-only pass (the model leaves a stale value from its last image pass)."""
        if "image_grid_thw" in enc:
            self._rope_deltas = self.model.model.rope_deltas
        else:
            self._rope_deltas = torch.zeros(enc["input_ids"].shape[0], 1, dtype=torch.long, device=self.device)

    def candidate_positions(self, pos: torch.Tensor, index: torch.Tensor) -> Dict[str, torch.Tensor]:
        """Candidate tokens are text: all three M-RoPE sections at the token's index plus its
        sample's offset ``rope_deltas`` (what ``generate`` continues with). Explicit, so
        candidates can be packed and batched."""
        deltas = getattr(self, "_rope_deltas", None)
        if deltas is None:  # no prefix pass yet (strategy probe): positions are explicit anyway
            return {"position_ids": pos[None].expand(3, -1, -1)}
        pos = pos + deltas.to(pos.device)[index]
        return {"position_ids": pos[None].expand(3, -1, -1)}

    def make_preprocessor(self, config: Dict[str, Any]) -> Any:
        return chat_template_preprocessor(self, config)


def build_tiny_qwen2_vl(out_dir: str, size: str = "tiny") -> None:
    """Random Qwen2VLForConditionalGeneration; 32x32 px per visual token group."""
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration, Qwen2VLProcessor
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    t, v = TEXT_SIZES[size], VISION_SIZES[size]
    tok = train_tiny_tokenizer(vocab_size=t["vocab"], extra_special=QWEN_SPECIAL)
    ids = {name: tok.convert_tokens_to_ids(name) for name in QWEN_SPECIAL}
    head_dim = t["hidden"] // t["heads"]
    half = head_dim // 2  # mrope sections (temporal, height, width) split the rotary half
    section = [half - 2 * (half * 3 // 8), half * 3 // 8, half * 3 // 8]
    patch, merge = v["patch"], 2
    config = Qwen2VLConfig(
        text_config=dict(vocab_size=len(tok), hidden_size=t["hidden"], intermediate_size=t["mlp"],
                         num_hidden_layers=t["layers"], num_attention_heads=t["heads"],
                         num_key_value_heads=t["kv"], max_position_embeddings=4096,
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": section},
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id),
        vision_config=dict(depth=v["layers"], embed_dim=v["hidden"], hidden_size=t["hidden"],
                           num_heads=v["heads"], mlp_ratio=2, patch_size=patch, spatial_merge_size=merge,
                           temporal_patch_size=2),
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=False)
    model = seeded_model(lambda: Qwen2VLForConditionalGeneration(config), size)
    unit = patch * merge
    image_processor = Qwen2VLImageProcessorPil(min_pixels=unit * unit, max_pixels=4 * unit * unit,
                                               patch_size=patch, merge_size=merge, temporal_patch_size=2)
    processor = Qwen2VLProcessor(image_processor=image_processor, tokenizer=tok,
                                 video_processor=image_only_video_processor(),
                                 chat_template=QWEN2_VL_CHAT_TEMPLATE)
    save_checkpoint(model, processor, tok, out_dir)


register_tiny_builder("qwen2_vl", build_tiny_qwen2_vl, version="1")
