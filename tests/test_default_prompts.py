"""Each family's default prompt, pinned to the exact text the model sees (issue 17).

The default follows what the family's checkpoints were trained and evaluated with (sources in
docs/models.md, "Default prompts"): the checkpoint's chat template where it has one (rendered
here with the tiny checkpoints' templates, shaped like the real ones), otherwise the documented
format: LLaVA-1.5's ``vicuna_v1`` conversation, BLIP-2's and InstructBLIP's VQA prompts,
PaliGemma's ``answer en`` task prefix. Two fixed samples: one image with a question and an
option list, and a multi-turn chat with history and a second image.
"""
from __future__ import annotations

import pytest
import torch
from PIL import Image

from reform_eval.utils.schema import IMAGE_TOKEN

_IMG = Image.new("RGB", (32, 32), (200, 30, 30))
ONE = {"sample_id": "one", "formulation": "SingleChoice", "inference_method": "generation",
       "instruct": "Answer with the option's letter.", "question": "What colour is the square?",
       "question_with_option": "What colour is the square? Options: (A) red; (B) blue.",
       "images": [_IMG], "history": []}
MULTI = {"sample_id": "multi", "formulation": "Generation", "question": IMAGE_TOKEN + "And this one?",
         "images": [_IMG, _IMG],
         "history": [{"from": "human", "value": IMAGE_TOKEN + "Describe the image."},
                     {"from": "assistant", "value": "A red square."},
                     {"from": "human", "value": "Is it big?"}, {"from": "assistant", "value": "No."}]}

Q1 = "Answer with the option's letter.\nWhat colour is the square? Options: (A) red; (B) blue."
VICUNA = ("A chat between a curious user and an artificial intelligence assistant. The assistant gives "
          "helpful, detailed, and polite answers to the user's questions. ")
CHATML_MULTI = ("<|im_start|>user\n{img}Describe the image.<|im_end|>\n<|im_start|>assistant\nA red square.<|im_end|>\n"
                "<|im_start|>user\nIs it big?<|im_end|>\n<|im_start|>assistant\nNo.<|im_end|>\n"
                "<|im_start|>user\n{img}And this one?<|im_end|>\n<|im_start|>assistant\n")
LLAVA_MULTI = ("USER: <image>\nDescribe the image. ASSISTANT: A red square.</s>USER: Is it big? ASSISTANT: No.</s>"
               "USER: <image>\nAnd this one? ASSISTANT:")


def _qa(answer: str) -> tuple:
    return (f"<image>Question: {Q1} {answer}:",
            f"Question: <image>Describe the image. {answer}: A red square. Question: Is it big? {answer}: No. "
            f"Question: <image>And this one? {answer}:")


#: (registry name, tiny builder, extra config) -> (single-image text, multi-turn text)
EXPECTED = {
    # llava-hf checkpoints carry a chat template: it is the default, with no system line
    ("llava", "llava", ()): (f"USER: <image>\n{Q1} ASSISTANT:", LLAVA_MULTI),
    ("llava_next", "llava_next", ()): (f"USER: <image>\n{Q1} ASSISTANT:", LLAVA_MULTI),
    # no chat template in the checkpoint: LLaVA-1.5's vicuna_v1 conversation
    # (placeholders stay where the sample's text has them)
    ("llava", "llava", (("preprocessor", "conv"),)): (f"{VICUNA}USER: <image>\n{Q1} ASSISTANT:",
                                                     VICUNA + LLAVA_MULTI.replace("<image>\n", "<image>")),
    ("llava_onevision", "llava_onevision", ()): (
        f"<|im_start|>user\n<image>\n{Q1}<|im_end|>\n<|im_start|>assistant\n", CHATML_MULTI.format(img="<image>\n")),
    ("qwen2_vl", "qwen2_vl", ()): (
        f"<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>{Q1}<|im_end|>\n<|im_start|>assistant\n",
        CHATML_MULTI.format(img="<|vision_start|><|image_pad|><|vision_end|>")),
    ("internvl", "internvl", ()): (
        f"<|im_start|>user\n<IMG_CONTEXT>\n{Q1}<|im_end|>\n<|im_start|>assistant\n",
        CHATML_MULTI.format(img="<IMG_CONTEXT>\n")),
    ("idefics3", "idefics3", ()): (
        f"User:<image>{Q1}<end_of_utterance>\nAssistant:",
        "User:<image>Describe the image.<end_of_utterance>\nAssistant: A red square.<end_of_utterance>\n"
        "User: Is it big?<end_of_utterance>\nAssistant: No.<end_of_utterance>\nUser:<image>And this one?"
        "<end_of_utterance>\nAssistant:"),
    ("mllama", "mllama", ()): (
        f"<s><|start_header_id|>user<|end_header_id|>\n\n<|image|>{Q1}<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n",
        "<s><|start_header_id|>user<|end_header_id|>\n\n<|image|>Describe the image.<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nA red square.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nIs it big?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nNo.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\n<|image|>And this one?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"),
    ("blip2", "blip2", ()): _qa("Answer"),  # OPT
    ("blip2", "blip2_t5", ()): _qa("Short answer"),  # Flan-T5
    ("instructblip", "instructblip", ()): _qa("Short answer"),
    ("instructblip", "instructblip_t5", ()): _qa("Short answer"),
    ("paligemma", "paligemma", ()): (
        f"<image>answer en {Q1}",
        "<image><image>Describe the image.\nA red square.\nIs it big?\nNo.\nanswer en And this one?"),
}


@pytest.mark.parametrize("key", list(EXPECTED), ids=lambda k: "-".join([k[1]] + [f"{a}={b}" for a, b in k[2]]))
def test_default_prompt_text(key):
    from reform_eval.models import get_model
    from reform_eval.models.tiny import tiny_model_path

    torch.set_num_threads(1)
    family, builder, extra = key
    interface, pre = get_model(family, {"model_name": tiny_model_path(builder), "device": "cpu", **dict(extra)})
    single, multi = EXPECTED[key]
    assert interface.render(pre(ONE)) == single
    assert interface.render(pre(MULTI)) == multi


def test_llava_without_a_chat_template_uses_vicuna_v1(cache_dir):
    """A checkpoint without a template falls back to the documented conversation by itself."""
    from reform_eval.models import get_model

    interface, _ = get_model("llava", {"model_name": "tiny", "device": "cpu"})
    interface.processor.chat_template = None
    pre = interface.make_preprocessor({})
    assert interface.render(pre(ONE)) == f"{VICUNA}USER: <image>\n{Q1} ASSISTANT:"
    assert "curious human" not in interface.render(pre(ONE))


def test_roles_option_parses_and_bad_values_fail_early():
    from reform_eval.models import check_model_options
    from reform_eval.utils.errors import ReformError
    from reform_eval.utils.preprocessors import parse_roles

    assert parse_roles("User, Bot", ("Question", "Answer")) == ("User", "Bot")
    assert parse_roles(None, ("Question", "Answer")) == ("Question", "Answer")
    check_model_options("blip2", {"roles": "Question,Answer"})
    with pytest.raises(ReformError, match="roles"):
        check_model_options("blip2", {"roles": "Question"})
    # a family that renders its chat template has no roles to set: refused, not ignored
    with pytest.raises(ReformError, match="unknown option 'roles'"):
        check_model_options("qwen2_vl", {"roles": "A,B"})
    with pytest.raises(ReformError, match="unknown option 'preprocessor'"):
        check_model_options("paligemma", {"preprocessor": "conv"})
