"""Idefics3 and SmolVLM (``HuggingFaceM4/Idefics3-8B-Llama3``, ``HuggingFaceTB/SmolVLM-*``).

Why thin: the processor splits each image into a grid of tiles plus a global view and
writes the ``<fake_token_around_image><row_i_col_j><image>*n`` runs itself; the interface
only renders prompts with the checkpoint's chat template ("User:<image>...<end_of_utterance>
\\nAssistant:"). SmolVLM checkpoints (``model_type`` ``smolvlm``) share the architecture;
their processor also carries a video processor, which needs ``torchvision`` installed.
"""
from __future__ import annotations

import logging
from typing import Any, Dict

from .. import register_model
from ..hf_base import HFBaseInterface
from ..tiny import register_tiny_builder, train_tiny_tokenizer
from ..tiny_zoo import (TEXT_SIZES, VISION_SIZES, chat_template_preprocessor, save_checkpoint,
                             seeded_model, tiny_text_config)

logger = logging.getLogger(__name__)

#: Idefics3's template (without the BOS, which the tokenizer adds)
IDEFICS3_CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] | capitalize }}"
    "{% if message['content'][0]['type'] == 'image' %}{{ ':' }}{% else %}{{ ': ' }}{% endif %}"
    "{% for line in message['content'] %}{% if line['type'] == 'text' %}{{ line['text'] }}"
    "{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}<end_of_utterance>\n"
    "{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)


@register_model("idefics3")
class Idefics3Interface(HFBaseInterface):
    """Idefics3 / SmolVLM: SigLIP tower, pixel-shuffle connector, Llama text model."""

    family = "idefics3"
    model_types = ("idefics3", "smolvlm")

    def make_preprocessor(self, config: Dict[str, Any]) -> Any:
        return chat_template_preprocessor(self, config)


def build_tiny_idefics3(out_dir: str, size: str = "tiny") -> None:
    """Random Idefics3ForConditionalGeneration; images split into up to 2x2 tiles + global."""
    from transformers import (Idefics3Config, Idefics3ForConditionalGeneration, Idefics3Processor,
                              LlamaConfig)
    from transformers.models.idefics3.configuration_idefics3 import Idefics3VisionConfig
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    t, v = TEXT_SIZES[size], VISION_SIZES[size]
    tok = train_tiny_tokenizer(vocab_size=t["vocab"], extra_special=(
        "<image>", "<fake_token_around_image>", "<global-img>", "<end_of_utterance>"))
    side, scale = v["image"], 2
    text_cfg = tiny_text_config(LlamaConfig, tok, t)
    vision_cfg = Idefics3VisionConfig(hidden_size=v["hidden"], intermediate_size=v["mlp"],
                                      num_hidden_layers=v["layers"], num_attention_heads=v["heads"],
                                      image_size=side, patch_size=v["patch"])
    config = Idefics3Config(vision_config=vision_cfg, text_config=text_cfg, scale_factor=scale,  # type: ignore[call-arg]  # transformers' config stubs omit what its **kwargs take
                            image_token_id=tok.convert_tokens_to_ids("<image>"),
                            pad_token_id=tok.pad_token_id, tie_word_embeddings=False)
    model = seeded_model(lambda: Idefics3ForConditionalGeneration(config), size)
    image_processor = Idefics3ImageProcessorPil(size={"longest_edge": 2 * side},
                                                max_image_size={"longest_edge": side}, do_image_splitting=True)
    seq_len = (side // v["patch"]) ** 2 // (scale ** 2)
    processor = Idefics3Processor(image_processor=image_processor, tokenizer=tok, image_seq_len=seq_len,
                                  chat_template=IDEFICS3_CHAT_TEMPLATE)
    save_checkpoint(model, processor, tok, out_dir)


register_tiny_builder("idefics3", build_tiny_idefics3, version="1")
