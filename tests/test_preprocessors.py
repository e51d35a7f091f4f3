"""Exact prompt strings from the preprocessors."""
import pytest

from reform_eval.utils.errors import ReformError
from reform_eval.utils.preprocessors import ChatTemplateProcessor, ConvProcessor, compose_query

SC = {"sample_id": "a", "formulation": "SingleChoice", "inference_method": "generation",
      "images": ["x.png"], "instruct": "Choose.", "question": "Is it red?",
      "question_with_option": "Is it red? Options: (A) yes; (B) no.",
      "history": [{"from": "human", "value": "Q1? Options: (A) x; (B) y."}, {"from": "assistant", "value": "(A) x"}]}


def test_two_sep_llava_style():
    assert ConvProcessor()(SC) == ("USER: Q1? Options: (A) x; (B) y. ASSISTANT: (A) x</s>"
                                   "USER: <image>\nChoose.\nIs it red? Options: (A) yes; (B) no. ASSISTANT:")


def test_one_sep_with_system_and_prefix():
    p = ConvProcessor(roles=("User", "Bot"), sep_style="one", seps=["\n"], system_msg="You are helpful.",
                      response_prefix="The answer is", options_in_history=False)
    assert p(SC) == ("You are helpful.\nUser: Q1?\nBot: (A) x\nUser: <image>\nChoose.\n"
                     "Is it red? Options: (A) yes; (B) no.\nBot: The answer is")


def test_likelihood_query_has_no_options():
    s = dict(SC, inference_method="likelihood", history=[])
    assert compose_query(s) == "<image>\nChoose.\nIs it red?"


def test_interleaved_images_kept_in_place():
    s = {"sample_id": "b", "formulation": "Generation", "images": ["1", "2"], "instruct": "",
         "question": "frame <image> then <image>: same?", "history": []}
    assert compose_query(s) == "frame <image> then <image>: same?"
    msgs = ChatTemplateProcessor()(s)
    assert msgs == [{"role": "user", "content": [{"type": "text", "text": "frame"}, {"type": "image"},
                                                  {"type": "text", "text": "then"}, {"type": "image"},
                                                  {"type": "text", "text": ": same?"}]}]


def test_placeholder_count_mismatch():
    s = {"sample_id": "c", "formulation": "Generation", "images": ["1", "2"], "instruct": "",
         "question": "only <image> one", "history": []}
    with pytest.raises(ReformError, match="1 image placeholders"):
        compose_query(s)


def test_a_question_that_is_no_text_is_one_line_naming_sample_and_field():
    """Found by mypy (count_image_tokens given ``str | None``): a sample whose question is None
    raised AttributeError from count_image_tokens, and with an instruction it even went to the
    model as the text 'None'."""
    for s in ({"sample_id": "q7", "formulation": "Generation", "images": [], "question": None},
              {"sample_id": "q7", "formulation": "Generation", "images": [], "instruct": "Answer.",
               "question": None}):
        with pytest.raises(ReformError, match=r"sample q7: field 'question' must be text, got NoneType"):
            compose_query(s)


def test_chat_template_history_roles():
    msgs = ChatTemplateProcessor(system_msg="sys")(SC)
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user"]
    assert msgs[-1]["content"][0] == {"type": "image"}
