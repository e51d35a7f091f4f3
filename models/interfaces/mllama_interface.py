"""Llama 3.2 Vision (``meta-llama/Llama-3.2-11B-Vision-Instruct``): ``MllamaForConditionalGeneration``.

Why this family needs care: images never enter the token stream. Each ``<|image|>`` token
marks where an image becomes visible; the vision encoder's tile features are read by
*cross-attention* layers interleaved with the Llama self-attention layers, and the
processor's ``cross_attention_mask`` (batch, text length, images, tiles) says which
images/tiles each text token may attend to (tokens before the first image see none).

* **Prefix cache:** the prefix pass fills the self-attention layers' cache with the prompt
  and the cross-attention layers' cache with the projected vision states, so candidates
  need no pixels. They do need a cross-attention mask: like ``generate``, a candidate token
  uses the prompt's last mask row (it sees the same images/tiles as the last prompt token).
  ``candidate_model`` wraps the model to pass it; the full-sequence reference extends the
  mask the same way (``extend_full_inputs``). Tested equal within 1e-4.
* **Multi-image:** native; the processor takes one list of images per prompt (tiles up to
  ``max_image_tiles`` each), this interface regroups the flat image list per prompt.
* Prompts are the checkpoint's chat template; its text already holds the BOS, so the
  processor tokenizes without special tokens (no double BOS).
"""
from __future__ import annotations

import logging
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch
from PIL import Image

from .. import register_model
from ..hf_base import HFBaseInterface
from ..tiny import register_tiny_builder, train_tiny_tokenizer
from ..tiny_zoo import (TEXT_SIZES, VISION_SIZES, chat_template_preprocessor, save_checkpoint,
                             seeded_model)

logger = logging.getLogger(__name__)

#: Llama 3.2 Vision's chat template shape (header ids, <|image|> in place, <|eot_id|>)
MLLAMA_CHAT_TEMPLATE = (
    "<s>{% for message in messages %}<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n"
    "{% for c in message['content'] %}{% if c['type'] == 'image' %}<|image|>"
    "{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}{% endfor %}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
MLLAMA_SPECIAL = ("<|image|>", "<|python_tag|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")


@register_model("mllama")
class MllamaInterface(HFBaseInterface):
    """Llama 3.2 Vision: tiled ViT, cross-attention layers in a Llama text model."""

    family = "mllama"
    model_types = ("mllama",)
    likelihood_strategy = "expand"

    def __init__(self, config: Optional[Dict[str, Any]] = None, load_weights: bool = True) -> None:
        self._last_xmask: Optional[torch.Tensor] = None
        self._prefix_xmask: Optional[torch.Tensor] = None
        super().__init__(config, load_weights)

    def make_preprocessor(self, config: Dict[str, Any]) -> Any:
        return chat_template_preprocessor(self, config)

    def batch_groups(self, images_list: Sequence[Sequence[Any]]) -> List[List[int]]:
        """Rows batch together only with rows of the same image count. Why: text tokens that
        see no image yet (before the first ``<|image|>``) have an all-masked cross-attention
        row, which transformers turns into an *unmasked* one (the row gate zeroes only the
        MLP branch), so they attend to every image slot of the batch, padded ones included:
        a prompt's logits change when a neighbour has more images (~0.1 on the tiny model).
        With equal image counts there are no padded slots and rows agree to ~1e-6."""
        groups: Dict[int, List[int]] = {}
        for i, ims in enumerate(images_list):
            groups.setdefault(len(ims), []).append(i)
        return list(groups.values())

    def _encode(self, texts: List[str], images: List[Image.Image]) -> Dict[str, torch.Tensor]:
        """Processor call with images nested per prompt; remembers the last prompt token's
        cross-attention mask row for candidate passes."""
        counts = [t.count(self.image_token) for t in texts]
        nested, k = [], 0
        for c in counts:
            nested.append(list(images[k:k + c]))
            k += c
        kwargs: Dict[str, Any] = {"text": texts, "return_tensors": "pt", "padding": True,
                                  "add_special_tokens": False}
        if images:
            kwargs["images"] = nested
        enc = self.processor(**kwargs)
        self.trace_encoded(texts, enc, images, counts)  # what the model is given (models.hf_provenance)
        out = self.to_model_inputs(enc)
        xmask = out.get("cross_attention_mask")
        self._last_xmask = xmask[:, -1:] if xmask is not None else None
        self._prefix_xmask = self._last_xmask  # per prompt; candidate chunks select rows from it
        return out

    def select_candidate_rows(self, index: torch.Tensor) -> None:
        """Batched likelihood: each candidate row uses its own sample's last mask row."""
        if self._prefix_xmask is not None:
            self._last_xmask = self._prefix_xmask[index]

    def candidate_model(self) -> Callable[..., Any]:
        """The model, with the prompt's last cross-attention mask row repeated over the
        candidate rows and tokens (as ``generate`` extends it)."""
        last = self._last_xmask
        if last is None:
            return self.model

        def run(input_ids: torch.Tensor, **kwargs: Any) -> Any:
            n, length = input_ids.shape
            xmask = last.expand(n, length, *last.shape[2:])
            return self.model(input_ids=input_ids, cross_attention_mask=xmask, **kwargs)
        return run

    def extend_full_inputs(self, full: Dict[str, Any], enc: Dict[str, Any], n_new: int) -> Dict[str, Any]:
        """Full-sequence reference: candidate tokens repeat the prompt's last mask row."""
        xmask = enc.get("cross_attention_mask")
        if xmask is not None:
            full["cross_attention_mask"] = torch.cat([xmask, xmask[:, -1:].expand(-1, n_new, -1, -1)], dim=1)
        return full


def _open_gates(model: Any) -> Any:
    """Set the cross-attention tanh gates (initialised to 0, i.e. images ignored) to 1, so the
    random model's outputs depend on the images and the cross-attention mask."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("cross_attn_attn_gate", "cross_attn_mlp_gate")):
                p.fill_(1.0)
    return model


def build_tiny_mllama(out_dir: str, size: str = "tiny") -> None:
    """Random MllamaForConditionalGeneration: tiled ViT (up to 2 tiles of 32 px) and a Llama
    text model with one cross-attention layer (index 1; layer 0 is self-attention)."""
    from transformers import MllamaConfig, MllamaForConditionalGeneration, MllamaProcessor
    from transformers.models.mllama.configuration_mllama import MllamaTextConfig, MllamaVisionConfig
    from transformers.models.mllama.image_processing_pil_mllama import MllamaImageProcessorPil

    t, v = TEXT_SIZES[size], VISION_SIZES[size]
    tok = train_tiny_tokenizer(vocab_size=t["vocab"], extra_special=MLLAMA_SPECIAL)
    side, tiles = v["image"], 2
    ratios = [[1, 1], [1, 2], [2, 1]]
    vision_cfg = MllamaVisionConfig(hidden_size=v["hidden"], num_hidden_layers=v["layers"], num_global_layers=1,
                                    attention_heads=v["heads"], intermediate_size=v["mlp"],
                                    vision_output_dim=2 * v["hidden"], image_size=side, patch_size=v["patch"],
                                    max_num_tiles=tiles, supported_aspect_ratios=ratios,
                                    intermediate_layers_indices=[0])
    n_layers = t["layers"] + 1
    text_cfg = MllamaTextConfig(vocab_size=len(tok), hidden_size=t["hidden"], num_hidden_layers=n_layers,
                                num_attention_heads=t["heads"], num_key_value_heads=t["kv"],
                                intermediate_size=t["mlp"], max_position_embeddings=4096,
                                rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                                cross_attention_layers=[1], bos_token_id=tok.bos_token_id,
                                eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    config = MllamaConfig(vision_config=vision_cfg, text_config=text_cfg,
                          image_token_index=tok.convert_tokens_to_ids("<|image|>"))
    model = seeded_model(lambda: _open_gates(MllamaForConditionalGeneration(config)), size)
    image_processor = MllamaImageProcessorPil(size={"height": side, "width": side}, max_image_tiles=tiles)
    processor = MllamaProcessor(image_processor=image_processor, tokenizer=tok, chat_template=MLLAMA_CHAT_TEMPLATE)
    save_checkpoint(model, processor, tok, out_dir)


register_tiny_builder("mllama", build_tiny_mllama, version="2")
