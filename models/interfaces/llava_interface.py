"""LLaVA-1.5 (llava-hf style checkpoints): a thin layer over the shared HF interface.

Why thin: loading, batching, generation and prefix-shared likelihood live in
``models.hf_base``; LLaVA only adds its accepted checkpoint type, its tiny builder and the
llava-1.5 conversation format (``"<system> USER: <image>\\n... ASSISTANT:"``).

Config keys (beyond ``HFBaseInterface``): ``preprocessor`` (``conv`` default, or
``chat_template`` to use the checkpoint's own template), ``system_msg`` (default: the
llava-1.5 system line), ``response_prefix`` (e.g. ``"The answer is"``).
"""
from __future__ import annotations

import logging
from typing import Any, Dict, Union

from models import register_model
from models.hf_base import HFBaseInterface
from utils.errors import ReformError
from utils.preprocessors import ChatTemplateProcessor, ConvProcessor

logger = logging.getLogger(__name__)

#: the system line of llava-1.5's "llava_v1" conversation template
LLAVA_SYSTEM = ("A chat between a curious human and an artificial intelligence assistant. "
                "The assistant gives helpful, detailed, and polite answers to the human's questions.")


@register_model("llava")
class LlavaInterface(HFBaseInterface):
    """LLaVA-1.5: CLIP vision tower + projector + Llama/Vicuna; ``<image>`` is the image token."""

    family = "llava"
    model_types = ("llava",)
    #: Llama text model: plain 1D positions and custom 4D masks, so candidates can be packed
    likelihood_strategy = "packed"

    def make_preprocessor(self, config: Dict[str, Any]) -> Union[ConvProcessor, ChatTemplateProcessor]:
        """llava-1.5 dialogue (roles USER/ASSISTANT, sep_style 'two'), or the chat template."""
        style = str(config.get("preprocessor") or "conv")
        system = config.get("system_msg", LLAVA_SYSTEM)
        prefix = config.get("response_prefix")
        if style == "chat_template":
            if not getattr(self.processor, "chat_template", None):
                raise ReformError(f"model {self.label}: preprocessor 'chat_template' asked, but the checkpoint "
                                  f"'{self.model_path}' has no chat template")
            self.chat_response_prefix = (" " + prefix) if prefix else None
            return ChatTemplateProcessor(system_msg=system, response_prefix=prefix)
        self.chat_response_prefix = None
        if style != "conv":
            raise ReformError(f"model {self.label}: unknown preprocessor '{style}'; valid names: chat_template, conv")
        return ConvProcessor(roles=("USER", "ASSISTANT"), sep_style="two", seps=(" ", "</s>"),
                             system_msg=system, response_prefix=prefix)
