"""Identical results on every axis: batch size and world size never change a prediction file.

One reference run per cell (batch 1, one process); every other batch size, and two ranks under
torchrun, must write the byte-identical prediction file and identical metrics. Every cell that
runs under two ranks does so in ONE torchrun launch (tests/torchrun_cells.py), shared through
the ``two_rank_runs`` fixture; those tests run on one xdist worker (``TWO_RANKS``). Cells cross
benchmark (iWISDM, MME placeholder images, MMMT-IF release-only and an MMDU-style multi-image
set, custom), method (generation, likelihood, sampled generation) and model (tiny LLaVA, tiny
Qwen2-VL, the random baseline, and the known-skill LLaVA on trials it answers right). The quick slice runs one cell per benchmark; the full cross is
marked slow.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from reform_eval import run_eval
from reform_eval.build.mme import write_placeholder_release
from reform_eval.evaluation.plan import plan_batches
from reform_eval.evaluation.reporting.scoring import results_files
from tests.conftest import ROOT, prediction_files, write_custom_dataset
from tests.test_mmmt_if_run import write_mmdu

QUESTIONS = os.path.join(ROOT, "configs", "data", "mme_questions")
METHODS = {
    "gen": ["--infer_method", "generation", "--max_new_tokens", "6"],
    "lik": ["--infer_method", "likelihood"],
    "sampled": ["--infer_method", "generation", "--num_samples", "2", "--temperature", "1", "--max_new_tokens", "6"],
}
MODELS = {"llava": ["--model", "llava", "--model_name", "tiny"],
          # the known-skill model (evaluation/training.py): its answers matter, so a batch or rank
          # that changed one would change the score, not just a random pick
          "trained": ["--model", "llava", "--model_name", "tiny-trained"],
          "qwen2_vl": ["--model", "qwen2_vl", "--model_name", "tiny"],
          "random": ["--model", "random"]}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("invariance")
    write_placeholder_release(QUESTIONS, str(d / "mme" / "release"), subtasks=["existence", "OCR"])
    (d / "mme" / "mme.yaml").write_text("root: release\nsubtasks: [existence, OCR]\n")
    return {
        "iWISDM": ["--dataset_name", "iWISDM", "--dataset_config", "iwisdm_low", "--dataset_subsample", "10",
                   "--dataset_duplication", "2"],
        "iWISDM-identify": ["--dataset_name", "iWISDM", "--dataset_config", "iwisdm_identify_category",
                            "--dataset_subsample", "24"],
        "MME": ["--dataset_name", "MME", "--dataset_config", str(d / "mme" / "mme.yaml"), "--dataset_subsample", "6"],
        "MMMT-IF-release": ["--dataset_name", "MMMT-IF", "--dataset_config", "mmmt_if_release_only",
                            "--dataset_subsample", "3"],
        "MMMT-IF-mmdu": ["--dataset_name", "MMMT-IF", "--dataset_config", write_mmdu(str(d / "mmdu"))],
        "custom": ["--dataset_name", "custom", "--dataset_config", write_custom_dataset(str(d / "custom"), n=7),
                   "--dataset_duplication", "2"],
    }


def _run(argv, out):
    assert run_eval.main([*argv, "--output_dir", str(out), "--do_eval"]) == 0
    return _outputs(out)


def _outputs(out):
    """(prediction file name, its bytes, metrics) of the one run in ``out``."""
    (pred,) = prediction_files(out)
    with open(pred, "rb") as f:
        content = f.read()
    results = results_files(pred)
    with open(results[0], encoding="utf-8") as f:
        metrics = json.load(f)["metrics"]
    return os.path.basename(pred), content, metrics


def same_predictions(a: bytes, b: bytes, method: str) -> bool:
    """Generation: byte-identical files. Likelihood: identical records and choices; the stored
    candidate log-probabilities of a left-padded batch may differ from batch 1 in float rounding
    (padding changes the reduction order), so they agree within 1e-4 (see docs/models.md;
    ``--model_option batched_likelihood=false`` makes them byte-identical too)."""
    if method != "lik" or a == b:
        return a == b
    ra, rb = json.loads(a), json.loads(b)
    if len(ra) != len(rb):
        return False
    for x, y in zip(ra, rb):
        lx, ly = x.pop("candidate_logprobs", []), y.pop("candidate_logprobs", [])
        if x != y or len(lx) != len(ly) or any(abs(p - q) > 1e-4 for p, q in zip(lx, ly)):
            return False
    return True


def _argv(data, bench, method, model):
    return [*MODELS[model], *data[bench], *METHODS[method], "--seed", "3"]


#: tests whose cells also run under two ranks share one torchrun, so they run on one worker
TWO_RANKS = pytest.mark.xdist_group("invariance-two-ranks")
#: the cells of the quick slice that run under two ranks (the wide part: qwen2_vl generation)
QUICK_TWO_RANKS = {"test_iwisdm_likelihood_batch_and_two_ranks": ("iWISDM", "lik", "llava"),
                   "test_trained_model_likelihood_batch_and_two_ranks": ("iWISDM-identify", "lik", "trained")}


def _two_rank_cell(item):
    """(bench, method, model) when this test item of this module also runs its cell under two ranks."""
    if getattr(item, "module", None) is None or item.module.__name__ != __name__:
        return None
    if item.originalname in QUICK_TWO_RANKS:
        return QUICK_TWO_RANKS[item.originalname]
    if item.originalname == "test_matrix":
        cell = tuple(item.callspec.params[k] for k in ("bench", "method", "model"))
        return cell if cell[2] == "qwen2_vl" and cell[1] == "gen" else None
    return None


@pytest.fixture(scope="module")
def two_rank_runs(request, data, tmp_path_factory):
    """{cell: (file name, bytes, metrics)} of every selected two-rank cell, all run in one
    torchrun process group (batch size 2 per rank)."""
    import json as _json
    cells = list(dict.fromkeys(c for c in map(_two_rank_cell, request.session.items) if c))
    root = tmp_path_factory.mktemp("two_ranks")
    argvs = [[*_argv(data, *cell), "--per_gpu_eval_batch_size", "2", "--output_dir", str(root / f"cell{i}"),
              "--do_eval"] for i, cell in enumerate(cells)]
    (root / "cells.json").write_text(_json.dumps(argvs))
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           os.path.join(ROOT, "tests", "torchrun_cells.py"), str(root / "cells.json")]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300 + 240 * len(cells))
    assert done.returncode == 0, done.stderr[-3000:]
    return {cell: _outputs(root / f"cell{i}") for i, cell in enumerate(cells)}


def check_cell(data, tmp_path, bench, method, model, batch_sizes=(3, 8), ranks=None):
    """Batch 1 is the reference; every other batch size, and ``ranks`` (the cell's two-rank run
    from ``two_rank_runs``) when given, must give the same file name, predictions and metrics."""
    argv = _argv(data, bench, method, model)
    name, ref, ref_metrics = _run([*argv, "--per_gpu_eval_batch_size", "1"], tmp_path / "b1")
    records = json.loads(ref)
    assert records and all("prediction" in r for r in records)
    for bs in batch_sizes:
        got = _run([*argv, "--per_gpu_eval_batch_size", str(bs)], tmp_path / f"b{bs}")
        assert got[0] == name, "batch size must not change the run identity"
        assert same_predictions(got[1], ref, method), f"{bench}/{method}/{model}: batch {bs} changed the predictions"
        assert got[2] == ref_metrics
    if ranks is not None:
        got = ranks[(bench, method, model)]
        assert got[0] == name and same_predictions(got[1], ref, method), \
            f"{bench}/{method}/{model}: two ranks changed the predictions"
        assert got[2] == ref_metrics
    return records


# -- the quick slice: one cell per benchmark, every axis at least once --------------------------
def test_mmmt_if_release_multi_turn_any_batch_size(data, tmp_path):
    """The bug that started this: turn t and t+1 of one chat in one batch (batch size > chats left)."""
    records = check_cell(data, tmp_path, "MMMT-IF-release", "gen", "llava", batch_sizes=(2, 3, 8))
    assert len({r["meta"]["chat_id"] for r in records}) == 3


@pytest.mark.slow  # (one torchrun launch of every two-rank cell)
@TWO_RANKS
def test_iwisdm_likelihood_batch_and_two_ranks(data, tmp_path, two_rank_runs):
    check_cell(data, tmp_path, "iWISDM", "lik", "llava", ranks=two_rank_runs)


@pytest.mark.slow
@TWO_RANKS
def test_trained_model_likelihood_batch_and_two_ranks(data, tmp_path, two_rank_runs):
    records = check_cell(data, tmp_path, "iWISDM-identify", "lik", "trained", ranks=two_rank_runs)
    right = sum(r["prediction"] == r["answer"] for r in records)
    assert right >= 0.75 * len(records), f"the known-skill model got {right} of {len(records)}"


def test_unbatched_likelihood_is_byte_identical(data, tmp_path):
    argv = [*MODELS["llava"], *data["custom"], *METHODS["lik"], "--model_option", "batched_likelihood=false"]
    _, ref, _ = _run([*argv, "--per_gpu_eval_batch_size", "1"], tmp_path / "b1")
    _, got, _ = _run([*argv, "--per_gpu_eval_batch_size", "3"], tmp_path / "b3")
    assert got == ref


def test_mme_generation_random(data, tmp_path):
    check_cell(data, tmp_path, "MME", "gen", "random")


def test_mmdu_sampled_generation(data, tmp_path):
    check_cell(data, tmp_path, "MMMT-IF-mmdu", "sampled", "llava", batch_sizes=(8,))


# -- the wide part ------------------------------------------------------------------------------
WIDE = [(b, m, mo) for b in ("iWISDM", "MME", "custom") for m in ("gen", "lik", "sampled") for mo in MODELS
        if not (mo == "random" and m == "sampled") and mo != "trained"]
WIDE += [("iWISDM-identify", m, "trained") for m in ("gen", "sampled")]
WIDE += [(b, m, mo) for b in ("MMMT-IF-release", "MMMT-IF-mmdu") for m in ("gen", "sampled") for mo in ("llava", "qwen2_vl")]
#: the quick slice's cells are not run twice
WIDE = [c for c in WIDE if c not in {("MMMT-IF-release", "gen", "llava"), ("iWISDM", "lik", "llava"),
                                     ("MME", "gen", "random"), ("MMMT-IF-mmdu", "sampled", "llava")}]


@pytest.mark.slow
@pytest.mark.spread
@pytest.mark.parametrize("bench,method,model", [pytest.param(*c, marks=[TWO_RANKS] if c[1:] == ("gen", "qwen2_vl") else [])
                                                for c in WIDE])
def test_matrix(request, data, tmp_path, bench, method, model):
    two = request.getfixturevalue("two_rank_runs") if (model, method) == ("qwen2_vl", "gen") else None
    check_cell(data, tmp_path, bench, method, model, ranks=two)


# -- the batch plan itself ------------------------------------------------------------------------
def test_plan_batches_never_puts_a_turn_beside_its_history():
    # two chats of three turns, interleaved by turn as rank_groups orders them
    keys = {0: ("a1", 0), 1: ("b1", 0), 2: ("a2", 0), 3: ("b2", 0), 4: ("a3", 0), 5: ("b3", 0)}
    deps = {2: [("a1", 0)], 3: [("b1", 0)], 4: [("a2", 0)], 5: [("b2", 0)]}
    for bs in (1, 2, 3, 4, 8):
        batches = plan_batches(list(keys), deps, keys, set(), bs)
        seen = set()
        for b in batches:
            assert len(b) <= bs
            assert all(k in seen for i in b for k in deps.get(i, ())), (bs, batches)
            seen.update(keys[i] for i in b)
        assert sorted(i for b in batches for i in b) == list(keys)
    assert plan_batches(list(keys), deps, keys, set(), 8) == [[0, 1], [2, 3], [4, 5]]
    # no dependencies: plain consecutive batches
    assert plan_batches(list(range(7)), {}, {i: (str(i), 0) for i in range(7)}, set(), 3) == [[0, 1, 2], [3, 4, 5], [6]]
    # a turn whose history is already done (a resumed run) is ready at once
    assert plan_batches([4], deps, keys, {("a2", 0)}, 2) == [[4]]
