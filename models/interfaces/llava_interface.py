"""LLaVA-1.5 (llava-hf style checkpoints): a thin layer over the shared HF interface.

Why thin: loading, batching, generation and prefix-shared likelihood live in
``models.hf_base``; LLaVA only adds its accepted checkpoint type, its tiny builder and its
default prompt.

Default prompt (issue 17: what the checkpoints were trained and evaluated with): the
checkpoint's own chat template where it has one; the llava-hf checkpoints' template has no
system line (``"USER: <image>\\n... ASSISTANT:"``). A checkpoint without a template gets
LLaVA-1.5's documented conversation, ``vicuna_v1`` (trained with ``--version v1``, evaluated
with ``--conv-mode vicuna_v1``): the ``VICUNA_V1_SYSTEM`` line, then
``"USER: <image>\\n... ASSISTANT:"``, answers closed by ``</s>``.

Config keys (beyond ``HFBaseInterface``): ``preprocessor`` (``chat_template`` or ``conv``;
default: the template when the checkpoint has one, else ``conv``), ``system_msg`` (default:
none with the template, ``VICUNA_V1_SYSTEM`` with ``conv``), ``response_prefix``.
"""
from __future__ import annotations

import logging
from typing import Any, Dict, Union

from .. import register_model
from ..hf_base import HFBaseInterface
from ...utils.errors import ReformError
from ...utils.preprocessors import ChatTemplateProcessor, ConvProcessor

logger = logging.getLogger(__name__)

#: the system line of LLaVA's ``vicuna_v1`` conversation (``conv_vicuna_v1`` in
#: llava/conversation.py), the one LLaVA-1.5 was trained and evaluated with; not ``llava_v1``'s
#: "curious human ... human's questions"
VICUNA_V1_SYSTEM = ("A chat between a curious user and an artificial intelligence assistant. "
                    "The assistant gives helpful, detailed, and polite answers to the user's questions.")


@register_model("llava")
class LlavaInterface(HFBaseInterface):
    """LLaVA-1.5: CLIP vision tower + projector + Llama/Vicuna; ``<image>`` is the image token."""

    family = "llava"
    model_types = ("llava",)
    #: Llama text model: plain 1D positions and custom 4D masks, so candidates can be packed
    likelihood_strategy = "packed"
    option_names = ("preprocessor",)

    def make_preprocessor(self, config: Dict[str, Any]) -> Union[ConvProcessor, ChatTemplateProcessor]:
        """The checkpoint's chat template (no system line unless ``system_msg``), or the
        ``vicuna_v1`` dialogue (roles USER/ASSISTANT, sep_style 'two') without one."""
        has_template = bool(getattr(self.processor, "chat_template", None))
        style = str(config.get("preprocessor") or ("chat_template" if has_template else "conv"))
        prefix = config.get("response_prefix")
        if style == "chat_template":
            if not has_template:
                raise ReformError(f"model {self.label}: preprocessor 'chat_template' asked, but the checkpoint "
                                  f"'{self.model_path}' has no chat template")
            self.chat_response_prefix = (" " + prefix) if prefix else None
            return ChatTemplateProcessor(system_msg=config.get("system_msg", ""), response_prefix=prefix)
        self.chat_response_prefix = None
        if style != "conv":
            raise ReformError(f"model {self.label}: unknown preprocessor '{style}'; valid names: chat_template, conv")
        return ConvProcessor(roles=("USER", "ASSISTANT"), sep_style="two", seps=(" ", "</s>"),
                             system_msg=config.get("system_msg", VICUNA_V1_SYSTEM), response_prefix=prefix)
