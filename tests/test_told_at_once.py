"""A mistake is told at once and rightly (issue 32, parts 1 and 2): a mistyped dataset config,
model family, built-in model name or data path is one line naming the closest valid value, exit
2, within about a second of CPU (no torch imported), nothing written; the hint for missing MMDU,
MME or synthetic data is the builder's one line, whatever the door (run_eval, the library,
commands/*.sh: tests/test_commands.py)."""
from __future__ import annotations

import os
import resource
import subprocess
import sys

import pytest

from tests.conftest import ROOT


def _env(tmp_path) -> dict:
    env = dict(os.environ)
    env["HF_HUB_CACHE"] = str(tmp_path / "hub")  # an empty hub cache: the message names it
    env.pop("RANK", None)
    env.pop("WORLD_SIZE", None)
    return env


def _run_eval(tmp_path, *args: str, cwd: str = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, os.path.join(ROOT, "run_eval.py"), *args,
                           "--output_dir", str(tmp_path / "out")], cwd=cwd, env=_env(tmp_path),
                          capture_output=True, text=True, timeout=300)


def _cpu_of(run) -> tuple:
    """(result, CPU seconds the child used): process CPU time, not wall-clock time."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = run()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return result, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


LLAVA = ("--model", "llava", "--model_name", "tiny", "--dataset_name", "iWISDM")

CASES = {
    "config typo": (LLAVA + ("--dataset_config", "iwisdm_hgh"),
                    "error: dataset config 'iwisdm_hgh': neither a file nor a shipped config (did you mean "
                    "iwisdm_high?); shipped configs: "),
    "family typo": (("--model", "llva", "--dataset_name", "iWISDM", "--dataset_config", "iwisdm_high"),
                    "error: unknown model 'llva' (did you mean llava?); valid names: blip2, "),
    "model-name typo": (("--model", "llava", "--model_name", "tiny-trainde", "--dataset_name", "iWISDM",
                         "--dataset_config", "iwisdm_high"),
                        "error: model llava: --model_name 'tiny-trainde' is neither a local checkpoint folder nor in "
                        "the Hugging Face cache ({hub}) (did you mean tiny-trained?); built-in names: tiny (random "
                        "weights), tiny-trained (the known-skill LLaVA); a hub checkpoint: `huggingface-cli download "
                        "ORG/NAME` on a machine with network, then run with HF_HUB_OFFLINE=1 (docs/models.md)"),
    "data path typo": (("--model", "llava", "--model_name", "tiny", "--dataset_name", "MME", "--dataset_config",
                        "mme", "--dataset_option", "root={data}/mme_synthtic"),
                       "error: {data}/mme_synthtic: field 'root': MME release folder not found (did you mean "
                       "{data}/mme_synthetic?); set it with --dataset_option root="),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_typo_is_one_line_with_the_closest_name_at_once_and_nothing_written(tmp_path, case):
    args, expected = CASES[case]
    data = tmp_path / "data"
    (data / "mme_synthetic").mkdir(parents=True)
    args = tuple(a.format(data=data) for a in args)
    expected = expected.format(hub=tmp_path / "hub", data=data)
    done, cpu = _cpu_of(lambda: _run_eval(tmp_path, *args))
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(expected), (lines, expected)
    assert not (tmp_path / "out").exists()  # no folder, no log.txt
    assert cpu < 3.0, f"{case}: {cpu:.2f} CPU-s to the error line (torch alone costs more)"


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_typo_is_told_before_torch_is_imported(tmp_path, case):
    """Deterministic twin of the CPU bound: the error comes before any heavy import."""
    args, _ = CASES[case]
    args = tuple(a.format(data=tmp_path) for a in args)
    code = ("import sys; from reform_eval.run_eval import main; "
            f"rc = main({list(args) + ['--output_dir', str(tmp_path / 'out')]!r}); "
            "print(rc, sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=_env(tmp_path), capture_output=True,
                          text=True, timeout=300)
    assert done.stdout.strip() == "2 []", (done.stdout, done.stderr)


def test_a_model_path_that_does_not_exist_names_its_neighbour(tmp_path):
    (tmp_path / "llava-7b").mkdir()
    done = _run_eval(tmp_path, "--model", "llava", "--model_name", str(tmp_path / "llava-7c"),
                     "--dataset_name", "iWISDM", "--dataset_config", "iwisdm_high")
    assert done.returncode == 2
    assert done.stderr.strip() == (f"error: {tmp_path}/llava-7c: checkpoint folder (--model llava --model_name) not "
                                   f"found (did you mean {tmp_path}/llava-7b?); give a checkpoint folder, an HF id in "
                                   "the local cache, or tiny or tiny-trained")
    assert not (tmp_path / "out").exists()


def test_a_hub_id_in_the_cache_passes_the_check(tmp_path, monkeypatch):
    from reform_eval.models import check_checkpoint_name
    from reform_eval.utils.errors import ReformError
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(ReformError, match=r"huggingface-cli download org/model-7b` on a machine with network"):
        check_checkpoint_name("qwen2_vl", "org/model-7b")
    (tmp_path / "models--org--model-7b" / "snapshots" / "abc123").mkdir(parents=True)
    check_checkpoint_name("qwen2_vl", "org/model-7b")
    check_checkpoint_name("openai_api", "gpt-4o")  # a served id: the endpoint knows it, not the cache


def test_the_families_without_checkpoints_are_the_ones_declared():
    from reform_eval.models import MODELS, NON_CHECKPOINT_FAMILIES, load_all
    load_all()
    assert tuple(sorted(n for n, c in MODELS.items() if not getattr(c, "family", None))) == NON_CHECKPOINT_FAMILIES


# -- one hint per missing thing, whatever the door -----------------------------------------------
def _clone(tmp_path) -> str:
    """A checkout without data/ (entries linked to the repository's)."""
    work = tmp_path / "clone"
    work.mkdir()
    for name in os.listdir(ROOT):
        if name not in (".git", ".venv", "output", "data", ".pytest_cache"):
            os.symlink(os.path.join(ROOT, name), work / name)
    return str(work)


DOORS = {
    "MMMT-IF": ("mmmt_if", "data/mmdu/benchmark.json: MMDU benchmark file not found; quick run without MMDU (the "
                "release's questions, no images): --dataset_config mmmt_if_release_only --dataset_subsample 3; "
                "your MMDU copy: --dataset_option mmdu_json=/path/to/benchmark.json --dataset_option "
                "image_folder=/path/to/mmdu_pics"),
    "MME": ("mme", "data/MME_Benchmark_release_version: field 'root': MME release folder not found; set it with "
            "--dataset_option root=/path/to/MME_Benchmark_release_version (or `root:` in the dataset config), use "
            "the HF layout with --dataset_option parquet=/path/to/MME/data, or try the pipeline on placeholder "
            "images with bash commands/mme_llava.sh"),
    "synthetic": ("mme_synthetic", "data/mme_synthetic: field 'root': synthetic MME-style set not found; write it "
                  "with: python -m reform_eval.build.mme_synthetic --out data/mme_synthetic"),
}


@pytest.mark.parametrize("what", sorted(DOORS))
def test_missing_data_is_one_hint_from_run_eval_and_the_library(tmp_path, monkeypatch, what):
    from reform_eval.build import load_reform_dataset
    from reform_eval.utils.errors import ReformError
    config, message = DOORS[what]
    work = _clone(tmp_path)
    path = os.path.join(work, "configs", "datasets", config + ".yaml")
    expected = f"error: {work}/{message}"
    name = "MMMT-IF" if what == "MMMT-IF" else "MME"
    done = _run_eval(tmp_path, "--model", "random", "--dataset_name", name, "--dataset_config", path, cwd=work)
    assert (done.returncode, done.stderr.strip()) == (2, expected)
    monkeypatch.chdir(work)
    with pytest.raises(ReformError) as e:
        load_reform_dataset(name, "Generation", path)
    assert "error: " + str(e.value) == expected


def test_the_library_door_gives_the_same_model_name_line(tmp_path, monkeypatch):
    """get_model (a Python caller, no RunConfig) says what run_eval says, not the hub client's
    'check your internet connection'."""
    from reform_eval.models import get_model
    from reform_eval.utils.errors import ReformError
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(ReformError) as e:
        get_model("llava", {"model_name": "tiny-trainde", "device": "cpu"})
    assert "error: " + str(e.value) == CASES["model-name typo"][1].format(hub=tmp_path / "hub")
