"""The known-skill model: a tiny LLaVA trained here, on CPU, on the tasks this harness generates.

Why: random weights score at chance, and a bug that scrambles the signal (candidates scored
against the wrong prefix, images dropped or misaligned, a template that hides the question)
leaves a random model at chance too, so no test can see it. A model with skill can: its
accuracy falls to chance when the signal is scrambled (tests/test_known_skill.py).

What it learns, from trials generated with training seeds (the benchmarks' shipped configs use
seed 0, so every evaluation below is on held-out trials), with the prompts the harness renders
for the ``llava`` family (``get_model("llava")``'s preprocessor and chat template), for both
inference methods (likelihood: the candidate after the prompt; generation: the option's text
and ``</s>`` after the prompt that lists the options):

* iWISDM ``identify_category`` / ``identify_location`` (name the object's feature),
  ``single_frame_category`` / ``single_frame_location`` (true/false against a constant),
  ``dms_category`` / ``dms_location`` (delayed match to sample);
* a few ``low`` / ``medium`` / ``high`` trials;
* the synthetic MME-style yes/no set (``build.mme_synthetic``).

Deterministic from ``SEED``: one CPU thread, fixed data order, deterministic algorithms, so
``python -m evaluation.train_known_skill --out DIR`` rebuilds ``models/checkpoints/llava-tiny-trained``
file for file (tests/test_known_skill.py checks it). The checkpoint is shipped (a few MB,
verified by SHA-256 on load, ``models.tiny.shipped_checkpoint``); without it,
``--model_name tiny-trained`` trains it once into the tiny-model cache.
"""
from __future__ import annotations

import json
import logging
import os
import random
import tempfile
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from transformers import LlavaForConditionalGeneration

from build import load_reform_dataset
from build.frame_order import write_frame_order_set
from build.mme_synthetic import write_yesno_release
from models import get_model
from models.tiny import (LLAVA_SIZES, SHIPPED_DIR, SHIPPED_MANIFEST, SHIPPED_VERSIONS, TINY_CORPUS, llava_parts,
                         register_tiny_builder, sha256_file, train_tiny_tokenizer)
from models.tiny_zoo import save_checkpoint, seeded_model
from utils.errors import ReformError

logger = logging.getLogger(__name__)

#: the recipe version (the cache and the shipped manifest carry it); bump it in
#: ``models.tiny.SHIPPED_VERSIONS`` whenever the recipe changes
VERSION = SHIPPED_VERSIONS["llava/trained"]
SEED = 20261126
#: training tasks: (benchmark, formulation, dataset config, items per inference method, stage);
#: a curriculum (see ``STAGE_STEPS``): stage k trains on the tasks of stages 1..k. ``custom`` is
#: the two-frame set of ``build.frame_order`` (the answer depends on the frames' order).
TASKS: Tuple[Tuple[str, str, Dict[str, Any], int, int], ...] = (
    ("iWISDM", "SingleChoice", {"preset": "identify_location"}, 480, 1),
    ("iWISDM", "SingleChoice", {"preset": "identify_category"}, 800, 2),
    ("custom", "SingleChoice", {}, 320, 3),
    ("MME", "Generation", {"subtasks": ["existence", "color"], "check_counts": False}, 320, 3),
    ("iWISDM", "SingleChoice", {"preset": "single_frame_category"}, 320, 3),
    ("iWISDM", "SingleChoice", {"preset": "single_frame_location"}, 160, 3),
    ("iWISDM", "SingleChoice", {"preset": "dms_category"}, 160, 4),
    ("iWISDM", "SingleChoice", {"preset": "dms_location"}, 160, 4),
    ("iWISDM", "SingleChoice", {"preset": "low"}, 96, 4),
    ("iWISDM", "SingleChoice", {"preset": "medium"}, 64, 4),
    ("iWISDM", "SingleChoice", {"preset": "high"}, 64, 4),
)
METHODS = ("likelihood", "generation")
#: optimisation. Steps per curriculum stage: the model first learns to look at the image on the
#: easiest task (the object's location), adds categories, then the two-frame set and the
#: comparisons with a word of the question (true/false, yes/no), then everything. Measured: with
#: every task mixed from the start (or even identification and yes/no together), 800 steps left
#: every task at chance; location alone is learnt in about 200 steps. The comparisons stay at
#: chance within this budget: whether two words name the same thing carries no signal in either
#: word alone, and gradient descent sits on that plateau far longer than ten CPU minutes
#: (docs/models.md has the numbers).
STAGE_STEPS, BATCH, LR, WARMUP = (250, 250, 350, 250), 16, 1e-3, 40

class Example:
    """One training sequence: prompt tokens (image placeholders expanded), target tokens, images."""

    __slots__ = ("ids", "n_prompt", "pixels")

    def __init__(self, ids: List[int], n_prompt: int, pixels: torch.Tensor) -> None:
        self.ids, self.n_prompt, self.pixels = ids, n_prompt, pixels


def training_samples(workdir: str, seed: int = SEED) -> List[Tuple[Dict[str, Any], int]]:
    """(unified sample with images loaded, curriculum stage) for every task and method, from training seeds."""
    out: List[Tuple[Dict[str, Any], int]] = []
    for k, (bench, formulation, cfg, n, stage) in enumerate(TASKS):
        cfg_k = dict(cfg)
        if bench == "MME":
            cfg_k["root"] = write_yesno_release(os.path.join(workdir, "yesno"), n_images=n // 2, seed=seed)
        elif bench == "custom":
            cfg_k = write_frame_order_set(os.path.join(workdir, "frame_order"), n=n, seed=seed)
        for m, method in enumerate(METHODS):
            if bench == "iWISDM":
                cfg_k.update(n_trials=n, seed=seed + 1000 * k + m, stim_dir="procedural")
            ds = load_reform_dataset(bench, formulation, dataset_config=cfg_k, inference_method=method,
                                     seed=seed + k, shuffle_options=True)
            held_out = evaluation_trials(cfg["preset"]) if bench == "iWISDM" else set()
            out.extend((ds[i], stage) for i in range(len(ds)) if trial_key(ds[i]) not in held_out)
    return out


#: how many trials of each shipped config (seed 0) are kept out of training
HELD_OUT = 500


def trial_key(sample: Dict[str, Any]) -> Optional[str]:
    """What the model sees of an iWISDM trial: its instruction and every frame's objects."""
    meta = sample.get("meta") or {}
    if "instruction" not in meta:
        return None
    return json.dumps([meta["instruction"], meta.get("frames")], sort_keys=True)


def evaluation_trials(preset: str) -> set:
    """The keys of the first ``HELD_OUT`` trials the shipped configs evaluate (seed 0). The
    procedural stimuli allow only 1,024 one-object frames, so training seeds alone repeat most
    of them; these are dropped from training, so every evaluated trial is unseen."""
    ds = load_reform_dataset("iWISDM", "SingleChoice", dataset_config={
        "preset": preset, "n_trials": HELD_OUT, "seed": 0, "stim_dir": "procedural"}, lazy_images=True)
    return {trial_key(ds[i]) for i in range(len(ds))}


def target_text(sample: Dict[str, Any]) -> str:
    """What the model learns to answer: the correct candidate (likelihood) or option text (generation)."""
    if sample.get("candidates"):
        return str(sample["candidates"][sample["answer_index"] if "answer_index" in sample else sample["answer"]])
    if sample.get("answer_options"):
        return str(sample["answer_options"][sample["answer"]])
    return str(sample["answer"])


def corpus(samples: Sequence[Dict[str, Any]]) -> List[str]:
    """Tokenizer training text: the built-in corpus plus every distinct prompt piece and answer."""
    seen: Dict[str, None] = {}
    for s in samples:
        for text in (s.get("instruct"), s.get("question_with_option") or s.get("question"), target_text(s)):
            if text:
                seen.setdefault(str(text), None)
    return list(TINY_CORPUS) + list(seen)


def encode(interface: Any, preprocessor: Any, samples: Sequence[Dict[str, Any]]) -> List[Example]:
    """Each sample as the harness would render it, plus the answer's tokens (``candidate_ids``,
    the split the likelihood scorer uses) and, for generation, ``</s>``."""
    eos = interface.tokenizer.eos_token_id
    out = []
    for s in samples:
        text = interface.render(preprocessor(s))
        images = interface._images(s["images"], 0)
        enc = interface.processor(text=[text], images=images or None, return_tensors="pt")
        prompt = enc["input_ids"][0].tolist()
        target = interface.candidate_ids(text, target_text(s))
        if s["inference_method"] == "generation":
            target = target + [eos]
        out.append(Example(prompt + target, len(prompt), enc["pixel_values"]))
    return out


def _batches(stages: Sequence[int], stage_steps: Sequence[int], batch: int, rng: random.Random) -> List[List[int]]:
    """Index batches (deterministic from ``rng``): ``stage_steps[k]`` batches drawn in shuffled
    epochs from the examples of stages 1..k+1 (``stages[i]`` is example i's stage)."""
    plan: List[List[int]] = []
    for k, n in enumerate(stage_steps):
        pool = [i for i, st in enumerate(stages) if st <= k + 1]
        order: List[int] = []
        while len(order) < n * batch:
            epoch = list(pool)
            rng.shuffle(epoch)
            order.extend(epoch)
        plan.extend(order[i * batch:(i + 1) * batch] for i in range(n))
    return plan


def _collate(examples: Sequence[Example], pad_id: int) -> Dict[str, torch.Tensor]:
    """Right-padded ids, mask and labels (answer tokens only), images in sample order."""
    width = max(len(e.ids) for e in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(examples), width), dtype=torch.long)
    labels = torch.full((len(examples), width), -100, dtype=torch.long)
    for r, e in enumerate(examples):
        ids[r, :len(e.ids)] = torch.tensor(e.ids)
        mask[r, :len(e.ids)] = 1
        labels[r, e.n_prompt:len(e.ids)] = torch.tensor(e.ids[e.n_prompt:])
    pixels = [e.pixels for e in examples if e.pixels is not None and len(e.pixels)]
    batch = {"input_ids": ids, "attention_mask": mask, "labels": labels}
    if pixels:
        batch["pixel_values"] = torch.cat(pixels)
    return batch


def train(model: Any, examples: Sequence[Example], pad_id: int, stages: Sequence[int], seed: int = SEED,
          stage_steps: Sequence[int] = STAGE_STEPS, batch: int = BATCH, lr: float = LR,
          log_every: int = 50) -> List[float]:
    """AdamW over the curriculum; returns the loss of every step."""
    rng = random.Random(seed)
    plan = _batches(stages, stage_steps, batch, rng)
    steps = len(plan)
    # the vision tower stays frozen, as in LLaVA-1.5's own recipe; trained along, this tiny random
    # tower collapses to one constant feature within a few hundred steps and the model never
    # looks at the image (measured: every task at chance), while frozen random features carry
    # the object's place and shape to the projector
    model.model.vision_tower.requires_grad_(False)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.01, betas=(0.9, 0.98))

    def rate(step: int) -> float:  # warm-up, constant, then a linear decay over the last fifth
        if step < WARMUP:
            return (step + 1) / WARMUP
        tail = steps - steps // 5
        return 1.0 if step < tail else max(0.05, 1.0 - (step - tail) / max(1, steps - tail))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, rate)
    model.train()
    losses = []
    t0 = time.perf_counter()
    for step, idx in enumerate(plan):
        out = model(**_collate([examples[i] for i in idx], pad_id))
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        losses.append(out.loss.item())
        if log_every and (step + 1) % log_every == 0:
            logger.info("step %d/%d loss %.4f (%.0fs)", step + 1, steps, sum(losses[-log_every:]) / log_every,
                        time.perf_counter() - t0)
    model.eval()
    return losses


def build_trained_llava(out_dir: str, size: str = "trained", seed: int = SEED) -> None:
    """Write the trained tiny LLaVA to ``out_dir`` (see the module docstring)."""
    logger.warning("training the known-skill LLaVA (about 6 CPU minutes) into %s", out_dir)

    threads = torch.get_num_threads()
    deterministic = torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(1)  # one thread: the same floating-point sums on every machine
    torch.use_deterministic_algorithms(True)
    rng_state = torch.random.get_rng_state()
    try:
        with tempfile.TemporaryDirectory(prefix="reform-train-") as work:
            tagged = training_samples(work, seed)
            samples = [s for s, _ in tagged]
            tokenizer = train_tiny_tokenizer(vocab_size=LLAVA_SIZES[size]["vocab"], extra_special=("<image>",),
                                             corpus=corpus(samples))
            config, processor = llava_parts(size, tokenizer)
            save_checkpoint(seeded_model(lambda: LlavaForConditionalGeneration(config), size, seed=seed),
                            processor, tokenizer, out_dir)
            interface, preprocessor = get_model("llava", {"model_name": out_dir, "dtype": "float32"})
            examples = encode(interface, preprocessor, samples)
            torch.manual_seed(seed)
            losses = train(interface.model, examples, tokenizer.pad_token_id, [st for _, st in tagged], seed)
            logger.info("trained on %d sequences; final loss %.4f", len(examples), sum(losses[-20:]) / 20)
            save_checkpoint(interface.model, interface.processor, interface.tokenizer, out_dir)
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic)
        torch.random.set_rng_state(rng_state)


register_tiny_builder("llava", build_trained_llava, version=VERSION, size="trained")

#: where the shipped checkpoint lives (under ``models/checkpoints``)
SHIPPED_NAME = "llava-tiny-trained"


def build_platform() -> Dict[str, str]:
    """What bit-for-bit reproduction depends on: the torch version and the CPU kernels it picks
    (one thread and deterministic algorithms remove every other source of variation)."""
    return {"torch": torch.__version__.split("+")[0], "cpu_capability": torch.backends.cpu.get_cpu_capability()}


def ship(out_dir: str) -> Dict[str, Any]:
    """Record ``out_dir``'s file hashes as the shipped ``llava/trained`` entry of the manifest."""
    entry = {"dir": os.path.relpath(out_dir, SHIPPED_DIR), "version": VERSION, "built_with": build_platform(),
             "sha256": {n: sha256_file(os.path.join(out_dir, n)) for n in sorted(os.listdir(out_dir))}}
    manifest = {}
    if os.path.isfile(SHIPPED_MANIFEST):
        with open(SHIPPED_MANIFEST, "r", encoding="utf-8") as f:
            manifest = json.load(f)
    manifest["llava/trained"] = entry
    with open(SHIPPED_MANIFEST, "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.write("\n")
    return entry
