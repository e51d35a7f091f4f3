"""``--model_option`` keys that run_eval sets itself are refused with advice that works: every
flag an error names exists in run_eval's parser (issue 17: ``device=cpu`` pointed to a
``--device`` flag that does not exist)."""
from __future__ import annotations

import re

import pytest

from reform_eval.evaluation.config import build_parser
from reform_eval.models import RUN_CONFIG_KEYS, check_model_options
from reform_eval.utils.errors import ReformError


def _flags() -> set:
    return {s for a in build_parser()._actions for s in a.option_strings}


@pytest.mark.parametrize("key", sorted(RUN_CONFIG_KEYS))
def test_run_keys_are_refused_naming_existing_flags(key):
    with pytest.raises(ReformError) as e:
        check_model_options("llava", {key: "cpu"})
    msg = str(e.value)
    assert msg.startswith(f"--model_option {key}: set by run_eval itself") and "\n" not in msg
    named = set(re.findall(r"--[a-z_]+", msg))
    assert named and named <= _flags(), named - _flags()


def test_device_advice_says_how_to_run_on_the_cpu():
    with pytest.raises(ReformError) as e:
        check_model_options("qwen2_vl", {"device": "cpu"})
    assert "CUDA_VISIBLE_DEVICES=" in str(e.value) and "--device " not in str(e.value)


def test_dtype_names_of_the_registry_are_the_loaders():
    from reform_eval.models import DTYPE_NAMES
    from reform_eval.models.hf_loading import _DTYPES
    assert set(DTYPE_NAMES) == set(_DTYPES)
