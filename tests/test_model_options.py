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


# -- issue 31 class 3: every numeric option is bounded at the option check ---------------------

#: the numeric options, each with the family that reads it
NUMERIC_OPTIONS = {
    "timeout": "openai_api", "max_retries": "openai_api", "max_concurrency": "openai_api",
    "backoff_base": "openai_api", "backoff_max": "openai_api", "max_total_tokens": "openai_api",
    "prompt_price": "openai_api", "completion_price": "openai_api", "max_new_tokens": "openai_api",
    "candidate_batch_size": "llava", "gpus_per_rank": "llava", "max_context_tokens": "llava",
    "tensor_parallel_size": "vllm", "max_model_len": "vllm", "max_images": "vllm",
}
ABSURD = [10 ** 16, 1e12, float("inf"), float("-inf"), float("nan"), -1, 10 ** 30, 1e308]


def test_every_numeric_option_is_listed_here():
    """A numeric option added to the checks joins this test (and so gets its bounds probed)."""
    from reform_eval.models import OPTION_CHECKS
    numeric = {k for k, (ok, _) in OPTION_CHECKS.items() if ok(1) or ok(1.5)} - {"client_processes"}
    assert numeric == set(NUMERIC_OPTIONS)


@pytest.mark.parametrize("key", sorted(NUMERIC_OPTIONS))
@pytest.mark.parametrize("value", ABSURD, ids=repr)
def test_an_absurd_number_is_one_line_naming_the_option(key, value):
    with pytest.raises(ReformError) as e:
        check_model_options(NUMERIC_OPTIONS[key], {key: value})
    msg = str(e.value)
    assert msg.startswith(f"--model_option {key}: must be ") and "\n" not in msg


def test_a_python_caller_gets_the_same_bounds(monkeypatch):
    """An interface built from Python (no option check) refuses the same values."""
    from reform_eval.models import get_model
    for value in (1e12, float("inf"), float("nan")):
        with pytest.raises(ReformError, match="^--model_option timeout: must be"):
            get_model("openai_api", {"model_name": "m", "base_url": "http://127.0.0.1:9/v1", "timeout": value})
    model, _ = get_model("openai_api", {"model_name": "m", "base_url": "http://127.0.0.1:9/v1", "timeout": 86400})
    assert model.timeout == 86400


@pytest.mark.parametrize("option", ["timeout=.inf", "timeout=1000000000000", "timeout=.nan", "backoff_max=1.0e300",
                                    "max_total_tokens=1.0e400"])
def test_the_command_line_ends_with_one_line_and_exit_2(option, tmp_path, capsys):
    from reform_eval import run_eval
    from tests.conftest import write_custom_dataset
    cfg = write_custom_dataset(str(tmp_path / "data"), n=1, formulation="Generation")
    code = run_eval.main(["--model", "openai_api", "--model_name", "m", "--dataset_name", "custom",
                          "--dataset_config", cfg, "--formulation", "Generation", "--output_dir", str(tmp_path / "o"),
                          "--model_option", "base_url=http://127.0.0.1:9/v1", "--model_option", option])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and f"--model_option {option.split('=')[0]}: must be" in err[0], err
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").rglob("*.json"))


@pytest.mark.parametrize("flag, value", [("--num_workers", "1000000000"), ("--num_samples", "100000000"),
                                         ("--per_gpu_eval_batch_size", "10000000000"), ("--max_new_tokens", "10" * 8),
                                         ("--seed", str(2 ** 70)), ("--temperature", "1e300"), ("--temperature", "inf")])
def test_a_run_flag_past_its_bound_is_one_line(flag, value, tmp_path, capsys):
    """The run's own numbers are bounded as the model options are (a billion DataLoader workers,
    a seed past 64 bits, a temperature of 1e300 passed the check)."""
    from reform_eval import run_eval
    from tests.conftest import write_custom_dataset
    cfg = write_custom_dataset(str(tmp_path / "data"), n=1, formulation="Generation")
    code = run_eval.main(["--model", "random", "--dataset_name", "custom", "--dataset_config", cfg,
                          "--formulation", "Generation", "--output_dir", str(tmp_path / "o"), flag, value])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].count(flag) == 1 and "must be" in err[0], err


@pytest.mark.parametrize("flag, option, says", [
    ("--model_option", "extra_body=&x {a: *x}", "recursive alias"),
    ("--model_option", "extra_body={a: &y [*y]}", "recursive alias"),
    ("--model_option", "extra_body={seed: .nan}", "not finite"),
    ("--model_option", "extra_body={max_tokens: 1.0e+309}", "not finite"),
    ("--model_option", "extra_body={1: 2}", "not text"),
    ("--model_option", "extra_body=" + "[" * 80 + "]" * 80, "nested deeper"),
    ("--model_option", "extra_body={a: " + "[" * 80 + "]" * 80 + "}", "nested deeper"),
    ("--dataset_option", "x=&x {a: *x}", "recursive alias"),
    ("--metric_option", "x=&y [*y]", "recursive alias"),
])
def test_a_value_that_is_no_plain_data_is_one_line_and_exit_2(flag, option, says, tmp_path, capsys):
    """``extra_body=&x {a: *x}`` ended as 'internal error ... RecursionError'; ``{seed: .nan}``
    and ``{max_tokens: 1.0e309}`` passed and sent NaN / Infinity, which is no JSON."""
    from reform_eval import run_eval
    from tests.conftest import write_custom_dataset
    cfg = write_custom_dataset(str(tmp_path / "data"), n=1, formulation="Generation")
    code = run_eval.main(["--model", "openai_api", "--model_name", "m", "--dataset_name", "custom",
                          "--dataset_config", cfg, "--formulation", "Generation", "--output_dir", str(tmp_path / "o"),
                          "--model_option", "base_url=http://127.0.0.1:9/v1", flag, option])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and f"{flag} {option.split('=')[0]}" in err[0] and says in err[0], err
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").rglob("*.json"))


def test_a_plain_extra_body_still_passes():
    from reform_eval.models import check_option_values
    check_option_values({"extra_body": {"top_k": 20, "stop": ["a"], "x": None, "p": 0.5}})
    with pytest.raises(ReformError, match="not finite"):
        check_option_values({"extra_body": {"seed": float("nan")}})  # a Python caller: the same check
