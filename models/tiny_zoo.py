"""Helpers shared by the per-family tiny builders of the model zoo.

Why: every family's builder (in its ``models/interfaces/<family>_interface.py``) needs the
same three steps around its architecture-specific config: deterministic random weights
that do not touch global RNG state, an output head scaled so greedy decoding and candidate
scores are discriminative (the default 0.02 init gives near-uniform logits full of ties),
and a ``save_pretrained`` of model + processor with the generation ids set. Sizes follow
``models.tiny.SIZES``: ``tiny`` for tests, ``bench`` (tens of millions of parameters) for
``bench/models.py``.
"""
from __future__ import annotations

import logging
from typing import Any, Callable, Dict

from .hf_compat import allow_video_processors_without_torchvision
from ..utils.errors import ReformError
from ..utils.preprocessors import ChatTemplateProcessor

logger = logging.getLogger(__name__)

#: text-model shapes per size (families map these onto their own config names)
TEXT_SIZES: Dict[str, Dict[str, int]] = {
    "tiny": dict(hidden=64, layers=2, heads=4, kv=2, mlp=128, vocab=600),
    "bench": dict(hidden=512, layers=8, heads=8, kv=8, mlp=1536, vocab=2000),
}
#: vision-tower shapes per size; ``image`` is the tile side, ``patch`` the patch side
VISION_SIZES: Dict[str, Dict[str, int]] = {
    "tiny": dict(hidden=32, layers=2, heads=2, mlp=64, image=32, patch=8),
    "bench": dict(hidden=384, layers=6, heads=6, mlp=1536, image=112, patch=14),
}


def seeded_model(make: Callable[[], Any], size: str, seed: int = 1234) -> Any:
    """Build ``make()`` under a fixed seed (global RNG restored) and rescale its output head.

    The weights depend only on the builder, never on what ran before in the process.
    """
    import torch  # heavy: loaded only to build a model

    state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        model = make()
        head = model.get_output_embeddings()
        if head is not None:
            with torch.no_grad():
                head.weight.normal_(0.0, 0.5 if size == "tiny" else 0.2)
    finally:
        torch.random.set_rng_state(state)
    return model


def tiny_text_config(config_cls: Any, tok: Any, t: Dict[str, int]) -> Any:
    """A decoder config of ``config_cls`` (LlamaConfig, Qwen2Config, ...) sized by a
    ``TEXT_SIZES`` entry, with the locally trained tokenizer's special-token ids."""
    return config_cls(vocab_size=len(tok), hidden_size=t["hidden"], intermediate_size=t["mlp"],
                      num_hidden_layers=t["layers"], num_attention_heads=t["heads"],
                      num_key_value_heads=t["kv"], max_position_embeddings=4096,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id, tie_word_embeddings=False)


def save_checkpoint(model: Any, processor: Any, tokenizer: Any, out_dir: str) -> None:
    """Set pad/eos/bos in the generation config and write model + processor to ``out_dir``.

    The weights are written by THIS process even under torchrun: transformers saves only on
    distributed rank 0, so a tiny model built by another rank would be left without weights
    (issue 9 item 7). Each builder writes its own private directory, so forcing is safe.
    transformers' "Writing model shards" bar is off: building a model is no news on the console.
    """
    from transformers.utils import logging as hf_logging  # heavy: only where a checkpoint is written

    gc = model.generation_config
    gc.pad_token_id = tokenizer.pad_token_id
    gc.eos_token_id = tokenizer.eos_token_id
    gc.bos_token_id = tokenizer.bos_token_id
    model.should_save_on_this_rank = lambda is_main_process: True  # instance override, see above
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        model.save_pretrained(out_dir)
    finally:
        del model.should_save_on_this_rank
        if bars:
            hf_logging.enable_progress_bar()
    processor.save_pretrained(out_dir)


# ----------------------------------------------------------------------------------------
# a base for families whose prompts are the checkpoint's own chat template

def chat_template_preprocessor(interface: Any, config: Dict[str, Any]) -> Any:
    """Chat messages rendered by the checkpoint's template (the way these families were
    trained); ``response_prefix`` is appended after the generation prompt."""

    if not getattr(interface.processor, "chat_template", None):
        raise ReformError(f"model {interface.label}: the checkpoint '{interface.model_path}' has no chat "
                          "template; this family renders prompts with it")
    prefix = config.get("response_prefix")
    interface.chat_response_prefix = prefix or None
    return ChatTemplateProcessor(system_msg=config.get("system_msg", ""), response_prefix=prefix)


def image_only_video_processor() -> Any:
    """A video processor placeholder for tiny checkpoints of families whose processor
    requires one (the harness feeds images only)."""
    allow_video_processors_without_torchvision()
    from transformers.video_processing_utils import VideoProcessorMixin
    return VideoProcessorMixin()
