"""The known-skill model: a tiny LLaVA trained here, on CPU, on the tasks this harness generates.

Why: random weights score at chance whether or not the harness feeds them correctly, and a bug
that scrambles the signal (candidates scored against the wrong prefix, images dropped or
misaligned, a question paired with another image, a template that hides the question) leaves a
random model at chance too, so no test can see it. A model with skill can: its accuracy falls
to chance when the signal is scrambled (tests/test_known_skill.py).

What it learns, from trials generated with training seeds (the benchmarks' shipped configs use
seed 0, and training trials that repeat an evaluated one are dropped), with the prompts the
harness renders for the ``llava`` family, for both inference methods (likelihood: the candidate
after the prompt; generation: the option's text and ``</s>`` after the prompt that lists the
options): iWISDM identification, true/false against a named category or location, delayed
match to sample and a few ``low`` / ``medium`` / ``high`` trials; a two-frame set whose answer
depends on the frames' order (``build.frame_order``); the synthetic MME-style yes/no set
(``build.mme_synthetic``).

The recipe (docs/models.md has the measurements behind each choice):

1. ``data``: the training samples, encoded as the harness renders them; iWISDM one- and
   two-frame tasks also without their long task description (``/short``), so the first stage
   trains on short sequences.
2. ``vision``: the CLIP tower is pretrained as a patch classifier (object category, identity and
   location; drawn colour and shape), then frozen, so its features separate what the
   questions name before the language model learns to compare.
3. ``compare``, ``full``, ``levels``: the language model and projector, with auxiliary probes
   (``evaluation.skill_targets``): linear heads that must name each operand of a comparison
   (the word in the question, the attribute in the image) and, one layer up, whether the two
   match. An equality has no signal in either operand alone, so trained on the answer only a
   small model sits at chance; the probes give each step a first-order target. The probes are
   training scaffolding and are not saved.

Deterministic from ``SEED``: one CPU thread, fixed data order, deterministic algorithms, so
``python -m reform_eval.evaluation.train_known_skill --out DIR`` rebuilds ``models/checkpoints/llava-tiny-trained``
file for file on the platform recorded in the manifest. The manifest also records the hash of the
training state at the end of every stage, so a cheap check retrains the first stages only
(``--check``; tests/test_known_skill.py). Without the shipped files, ``--model_name tiny-trained``
trains it once into the tiny-model cache.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from transformers import LlavaForConditionalGeneration

from ..build import load_reform_dataset
from ..build.frame_order import write_frame_order_set
from ..build.mme_synthetic import write_yesno_release
from ..build.mme_synthetic import SHAPES
from .skill_targets import (CATEGORIES, CLAUSE_PROBES, COLOUR_NAMES, LOCATION_NAMES, MATCH_PROBES, PROBES,
                                      drawn_truth, frame_labels, probe_targets)
from ..models import get_model
from ..models.tiny import (LLAVA_SIZES, SHIPPED_DIR, SHIPPED_MANIFEST, SHIPPED_VERSIONS, TINY_CORPUS, llava_parts,
                         register_tiny_builder, sha256_file, train_tiny_tokenizer)
from ..models.tiny_zoo import save_checkpoint, seeded_model

logger = logging.getLogger(__name__)

#: the recipe version (the cache and the shipped manifest carry it); bump it in
#: ``models.tiny.SHIPPED_VERSIONS`` whenever the recipe changes
VERSION = SHIPPED_VERSIONS["llava/trained"]
SEED = 20261126


@dataclass(frozen=True)
class Task:
    """One training task: ``n`` items per inference method; ``short``: also trained without the
    iWISDM task description (the ``<name>/short`` copy)."""

    name: str
    bench: str
    formulation: str
    config: Dict[str, Any]
    n: int
    short: bool = False


_MME = {"subtasks": ["existence", "color"], "check_counts": False}
TASKS: Tuple[Task, ...] = (
    Task("yesno", "MME", "Generation", _MME, 640),
    Task("identify_location", "iWISDM", "SingleChoice", {"preset": "identify_location"}, 480, short=True),
    Task("identify_category", "iWISDM", "SingleChoice", {"preset": "identify_category"}, 800, short=True),
    Task("single_frame_category", "iWISDM", "SingleChoice", {"preset": "single_frame_category"}, 640, short=True),
    Task("single_frame_location", "iWISDM", "SingleChoice", {"preset": "single_frame_location"}, 320, short=True),
    Task("dms_category", "iWISDM", "SingleChoice", {"preset": "dms_category"}, 320, short=True),
    Task("dms_location", "iWISDM", "SingleChoice", {"preset": "dms_location"}, 320, short=True),
    Task("frame_order", "custom", "SingleChoice", {}, 320),
    Task("low", "iWISDM", "SingleChoice", {"preset": "low"}, 800),
    Task("medium", "iWISDM", "SingleChoice", {"preset": "medium"}, 200),
    Task("high", "iWISDM", "SingleChoice", {"preset": "high"}, 100),
)
METHODS = ("likelihood", "generation")

_SHORT = tuple(f"{t.name}/short" for t in TASKS if t.short)
_FULL_FEW = tuple(t.name for t in TASKS if t.short)


@dataclass(frozen=True)
class Stage:
    """A curriculum stage: ``steps`` batches drawn from ``tasks`` (each batch from one task,
    picked with probability proportional to its number of sequences times ``TASK_WEIGHTS``)."""

    name: str
    steps: int
    tasks: Tuple[str, ...] = ()


#: the curriculum (docs/models.md): the tower first; then comparisons on short sequences (cheap,
#: and short enough that attention finds the question's word quickly); then the harness's full
#: prompts; then everything, the multi-frame levels included
STAGES: Tuple[Stage, ...] = (
    Stage("vision", 300),
    Stage("compare", 1000, ("yesno", "frame_order") + _SHORT),
    Stage("full", 700, ("yesno", "frame_order") + _SHORT + _FULL_FEW),
    Stage("levels", 800, tuple(t.name for t in TASKS) + _SHORT),
)
#: batch weights relative to a task's size (the yes/no set has the most sequences, the short
#: identification copies are learnt fastest)
TASK_WEIGHTS = {"yesno": 0.4, "identify_location": 0.5, "identify_category": 0.5,
                "identify_location/short": 0.5, "identify_category/short": 0.5}
BATCH, LR, WARMUP = 16, 2e-3, 40
VISION_BATCH, VISION_LR = 64, 2e-3
#: the probes read the first decoder layer's output (the operands) and the second's (whether they match)
OPERAND_LAYER, MATCH_LAYER, CLAUSE_LAYER = 0, 1, 2
#: how many trials of each shipped config (seed 0) are kept out of training
HELD_OUT = 500
#: the language-model step whose weights' hash the manifest records for the cheap reproducibility
#: check (``--check``: the data, the tower and this many steps, about 2 CPU minutes, instead of the
#: whole recipe)
CHECK_STEPS = 100


class Example:
    """One training sequence: prompt tokens (image placeholders expanded) then target tokens, its
    frames (keys of ``encode``'s frame table, in order), its probe targets (class indices) and
    where its question probes start (None: at the answer)."""

    __slots__ = ("ids", "n_prompt", "task", "frame_keys", "probes", "spread_from")

    def __init__(self, ids: List[int], n_prompt: int, task: str, frame_keys: List[str], probes: Dict[str, int],
                 spread_from: Optional[int]) -> None:
        self.ids, self.n_prompt, self.task, self.frame_keys = ids, n_prompt, task, frame_keys
        self.probes, self.spread_from = probes, spread_from


# -- data -----------------------------------------------------------------------------------------
def training_samples(workdir: str, seed: int = SEED) -> List[Tuple[Dict[str, Any], str]]:
    """(unified sample with images loaded, task name) for every task and method, from training seeds
    (the ``/short`` copies included)."""
    out: List[Tuple[Dict[str, Any], str]] = []
    for k, task in enumerate(TASKS):
        cfg: Any = dict(task.config)  # the options, or the path of a config file written here
        if task.bench == "MME":
            cfg["root"] = write_yesno_release(os.path.join(workdir, "yesno"), n_images=task.n // 2, seed=seed)
        elif task.bench == "custom":
            cfg = write_frame_order_set(os.path.join(workdir, "frame_order"), n=task.n, seed=seed)
        held_out = evaluation_trials(task.config["preset"]) if task.bench == "iWISDM" else set()
        for m, method in enumerate(METHODS):
            if task.bench == "iWISDM":
                cfg.update(n_trials=task.n, seed=seed + 1000 * k + m, stim_dir="procedural")
            ds = load_reform_dataset(task.bench, task.formulation, dataset_config=cfg, inference_method=method,
                                     seed=seed + k, shuffle_options=True)
            kept = [ds[i] for i in range(len(ds)) if trial_key(ds[i]) not in held_out]
            out.extend((s, task.name) for s in kept)
            if task.short:
                out.extend((dict(s, instruct=""), f"{task.name}/short") for s in kept)
    return out


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


def _last_occurrence(ids: Sequence[int], pattern: Sequence[int], end: int) -> Optional[int]:
    """Index of the last token of the last occurrence of ``pattern`` in ``ids[:end]``."""
    n = len(pattern)
    for i in range(end - n, -1, -1):
        if list(ids[i:i + n]) == list(pattern):
            return i + n - 1
    return None


Frames = Dict[str, Tuple[torch.Tensor, Any]]


def encode(interface: Any, preprocessor: Any, tagged: Sequence[Tuple[Dict[str, Any], str]]
           ) -> Tuple[List[Example], Frames]:
    """Each sample as the harness renders it, plus the answer's tokens (``candidate_ids``, the
    split the likelihood scorer uses; for generation, then ``</s>``), its probe targets and where
    its question probes start (the last token of the question's word, found in the prompt); and
    the distinct frames (pixel values as the processor makes them, and their label)."""
    samples = [s for s, _ in tagged]
    truth = drawn_truth(samples)
    tok = interface.tokenizer
    eos = tok.eos_token_id
    out: List[Any] = []
    frames: Dict[Any, Any] = {}
    for s, task in tagged:
        text = interface.render(preprocessor(s))
        images = interface._images(s["images"], 0)
        enc = interface.processor(text=[text], images=images or None, return_tensors="pt")
        prompt = enc["input_ids"][0].tolist()
        target = interface.candidate_ids(text, target_text(s))
        if s["inference_method"] == "generation":
            target = target + [eos]
        values = probe_targets(s, truth)
        probes = {name: PROBES[name][0].index(v) for name, v in values.items()}
        spread_from = None
        for name, v in values.items():
            if PROBES[name][1] and name != "neg":  # a word of the question (negation is not one word)
                at = _last_occurrence(prompt, tok(" " + v, add_special_tokens=False)["input_ids"], len(prompt))
                if at is not None:
                    spread_from = at if spread_from is None else min(spread_from, at)
        keys = []
        pixels = enc.get("pixel_values")
        for px, label in zip(pixels if pixels is not None else [], frame_labels(s, truth)):
            key = frame_key(px)
            if key not in frames or frames[key][1] is None:
                frames[key] = (px, label)
            keys.append(key)
        out.append(Example(prompt + target, len(prompt), task, keys, probes, spread_from))
    return out, frames


def data_sha256(examples: Sequence[Example], frames: Frames) -> str:
    """SHA-256 of the encoded training data (sequences, frames, probe targets): the data stage's fingerprint."""
    h = hashlib.sha256()
    for e in examples:
        h.update(json.dumps([e.ids, e.n_prompt, e.task, e.frame_keys, sorted(e.probes.items()), e.spread_from])
                 .encode())
    for key in sorted(frames):
        h.update(key.encode() + json.dumps(frames[key][1]).encode())
    return h.hexdigest()


def frame_key(pixels: torch.Tensor) -> str:
    """A frame's identity: the hash of its pixel values (delay frames recur in many trials)."""
    return hashlib.sha256(pixels.contiguous().numpy().tobytes()).hexdigest()


# -- the vision tower, pretrained as a patch classifier -------------------------------------------
#: per-patch classes: the iWISDM object's category (or no object), identity and location; the drawn
#: shape's colour and shape (or background)
VISION_HEADS: Dict[str, int] = {"category": len(CATEGORIES) + 1, "identity": 8 * len(CATEGORIES),
                                "location": len(LOCATION_NAMES), "colour": len(COLOUR_NAMES) + 1,
                                "shape": len(SHAPES) + 1}


def patch_labels(pixels: torch.Tensor, label: Any, grid: int) -> Dict[str, List[int]]:
    """Per-patch targets of one frame (-100 where unknown). An iWISDM object fills one quadrant; a
    drawn shape's patches are those at least a quarter covered by pixels off the background."""
    out = {k: [-100] * grid * grid for k in VISION_HEADS}
    if label is None:
        return out
    if label[0] in ("object", "blank"):
        out["category"] = [len(CATEGORIES)] * grid * grid
        if label[0] == "object":
            _, category, identity, location = label
            top, left = location.startswith("bottom") * grid // 2, location.endswith("right") * grid // 2
            for r in range(top, top + grid // 2):
                for c in range(left, left + grid // 2):
                    out["category"][r * grid + c] = CATEGORIES.index(category)
                    out["identity"][r * grid + c] = CATEGORIES.index(category) * 8 + identity
                    out["location"][r * grid + c] = LOCATION_NAMES.index(location)
    elif label[0] == "drawn":
        background = pixels.reshape(3, -1).median(-1).values[:, None, None]
        drawn = ((pixels - background).abs().sum(0) > 0.3).float()
        side = pixels.shape[-1] // grid
        cover = drawn.reshape(grid, side, grid, side).mean((1, 3)).reshape(-1)
        for p in range(grid * grid):
            if cover[p] > 0.25:
                out["colour"][p], out["shape"][p] = COLOUR_NAMES.index(label[1]), SHAPES.index(label[2])
            elif cover[p] == 0:
                out["colour"][p], out["shape"][p] = len(COLOUR_NAMES), len(SHAPES)
    return out


def pretrain_vision(model: Any, frames: Dict[str, Tuple[torch.Tensor, Any]], steps: int, seed: int) -> None:
    """Train the tower's selected layer to classify every patch (``VISION_HEADS``), then freeze it."""
    tower, layer = model.model.vision_tower, model.config.vision_feature_layer
    grid = model.config.vision_config.image_size // model.config.vision_config.patch_size
    items = [(px, lab) for px, lab in frames.values() if lab is not None]
    labels = [patch_labels(px, lab, grid) for px, lab in items]
    targets = {k: torch.tensor([lab[k] for lab in labels]) for k in VISION_HEADS}
    pixels = torch.stack([px for px, _ in items])
    heads = torch.nn.ModuleDict({k: torch.nn.Linear(tower.config.hidden_size, n) for k, n in VISION_HEADS.items()})
    params = list(tower.parameters()) + list(heads.parameters())
    tower.requires_grad_(True)
    opt = torch.optim.AdamW(params, lr=VISION_LR, weight_decay=0.01)
    rng = random.Random(seed)
    order: List[Any] = []
    tower.train()
    for step in range(steps):
        if len(order) < VISION_BATCH:
            epoch = list(range(len(items)))
            rng.shuffle(epoch)
            order += epoch
        idx, order = torch.tensor(order[:VISION_BATCH]), order[VISION_BATCH:]
        feats = tower(pixels[idx], output_hidden_states=True).hidden_states[layer][:, 1:]
        loss = torch.zeros(())
        for k, n in VISION_HEADS.items():
            y = targets[k][idx].reshape(-1)
            if bool((y >= 0).any()):
                loss = loss + F.cross_entropy(heads[k](feats).reshape(-1, n), y, ignore_index=-100)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if (step + 1) % 100 == 0:
            logger.info("vision step %d/%d loss %.4f", step + 1, steps, loss.item())
    tower.eval()
    tower.requires_grad_(False)


# -- the language model with probes -----------------------------------------------------------------
class Trainer:
    """The LLaVA forward pass over frozen tower features (computed once per distinct frame), with
    the probe heads. The same computation as ``LlavaModel.forward`` (image features scattered into
    the token embeddings, then the Llama model; tests/test_known_skill.py checks it), except that
    a prompt prefix shared by every row of a batch (the long iWISDM task description) is run once
    and its keys and values are broadcast to the batch, which makes long prompts cheap."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.lm = model.model.language_model
        hidden = self.lm.config.hidden_size
        self.heads = torch.nn.ModuleDict({name: torch.nn.Linear(hidden, len(classes))
                                          for name, (classes, _) in PROBES.items()})
        self.features: Dict[str, torch.Tensor] = {}

    @torch.no_grad()
    def tower_features(self, pixels: torch.Tensor) -> torch.Tensor:
        tower = self.model.model.vision_tower
        return tower(pixels, output_hidden_states=True).hidden_states[self.model.config.vision_feature_layer][:, 1:]

    def _embed(self, ids: torch.Tensor, feats: Optional[torch.Tensor]) -> torch.Tensor:
        emb = self.lm.embed_tokens(ids)
        if feats is not None:
            img = self.model.model.multi_modal_projector(feats)
            where = (ids == self.model.config.image_token_id).unsqueeze(-1).expand_as(emb)
            emb = emb.masked_scatter(where, img.reshape(-1, img.shape[-1]).to(emb.dtype))
        return emb

    def forward(self, ids: torch.Tensor, mask: torch.Tensor, feats: Optional[torch.Tensor],
                layers: Sequence[int] = ()) -> Tuple[torch.Tensor, Dict[int, torch.Tensor]]:
        """(last hidden state, {layer: that decoder layer's output}) of right-padded rows."""
        from transformers import DynamicCache

        got: Dict[int, List[torch.Tensor]] = {}

        def hook(layer: int) -> Callable[..., None]:
            def record(_mod: Any, _inp: Any, out: Any) -> None:
                got.setdefault(layer, []).append(out[0] if isinstance(out, tuple) else out)
            return record
        hooks = [self.lm.layers[k].register_forward_hook(hook(k)) for k in layers]
        try:
            p = shared_prefix(ids, mask, self.model.config.image_token_id)
            if p < 8 or ids.shape[0] == 1:
                out = self.lm(inputs_embeds=self._embed(ids, feats), attention_mask=mask)
                return out.last_hidden_state, {k: v[0] for k, v in got.items()}
            b = ids.shape[0]
            head = self.lm(inputs_embeds=self._embed(ids[:1, :p], None), use_cache=True)
            cache = DynamicCache(ddp_cache_data=[(c.keys.expand(b, -1, -1, -1), c.values.expand(b, -1, -1, -1))
                                                 for c in head.past_key_values.layers], config=self.lm.config)
            positions = torch.arange(p, ids.shape[1]).unsqueeze(0).expand(b, -1)
            tail = self.lm(inputs_embeds=self._embed(ids[:, p:], feats), attention_mask=mask, cache=cache,
                           position_ids=positions, use_cache=True)
            hidden = torch.cat([head.last_hidden_state.expand(b, -1, -1), tail.last_hidden_state], 1)
            return hidden, {k: torch.cat([v[0].expand(b, -1, -1), v[1]], 1) for k, v in got.items()}
        finally:
            for h in hooks:
                h.remove()

    def loss(self, batch: Sequence[Example], pad_id: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """(answer loss, probe loss) of one batch."""
        width = max(len(e.ids) for e in batch)
        ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for r, e in enumerate(batch):
            ids[r, :len(e.ids)] = torch.tensor(e.ids)
            mask[r, :len(e.ids)] = 1
        frames = [self.features[k] for e in batch for k in e.frame_keys] if any(e.frame_keys for e in batch) else []
        feats = torch.stack(frames) if frames else None
        hidden, at = self.forward(ids, mask, feats, (OPERAND_LAYER, MATCH_LAYER, CLAUSE_LAYER))
        rows, cols, targets = [], [], []
        probes: Dict[Tuple[str, int], List[Tuple[int, int, int]]] = {}
        for r, e in enumerate(batch):
            answer = range(e.n_prompt - 1, len(e.ids) - 1)
            for p in answer:
                rows.append(r)
                cols.append(p)
                targets.append(e.ids[p + 1])
            for name, value in e.probes.items():
                layer = (CLAUSE_LAYER if name in CLAUSE_PROBES else MATCH_LAYER if name in MATCH_PROBES
                         else OPERAND_LAYER)
                spread = PROBES[name][1] and e.spread_from is not None
                where = range(e.spread_from, len(e.ids) - 1) if spread and e.spread_from is not None else answer
                probes.setdefault((name, layer), []).extend((r, p, value) for p in where)
        logits = self.model.lm_head(hidden[torch.tensor(rows), torch.tensor(cols)])
        answer_loss = F.cross_entropy(logits.float(), torch.tensor(targets))
        probe_loss: torch.Tensor = torch.zeros(())
        for (name, layer), entries in sorted(probes.items()):
            rt, pt, vt = (torch.tensor(x) for x in zip(*entries))
            probe_loss = probe_loss + F.cross_entropy(self.heads[name](at[layer][rt, pt]), vt)
        return answer_loss, probe_loss


def shared_prefix(ids: torch.Tensor, mask: torch.Tensor, image_token_id: int) -> int:
    """How many leading tokens every row shares (stopping before the first image token)."""
    same = (ids == ids[0]).all(0) & (ids[0] != image_token_id) & (mask == 1).all(0)
    differ = (~same).nonzero()
    return int(differ[0, 0]) if len(differ) else ids.shape[1] - 1


def state_sha256(model: Any) -> str:
    """SHA-256 of the model's weights (safetensors bytes, sorted names): a stage's fingerprint."""
    from safetensors.torch import save

    return hashlib.sha256(save({k: v.contiguous() for k, v in model.state_dict().items()})).hexdigest()


def batch_plan(examples: Sequence[Example], seed: int, stages: Sequence[Stage] = STAGES) -> List[Tuple[str, List[int]]]:
    """(stage name, example indices) per step, deterministic from ``seed``: each batch is drawn
    from one task (a task's sequences have one length, so little padding and a shared prompt
    prefix) in shuffled epochs."""
    by_task: Dict[str, List[int]] = {}
    for i, e in enumerate(examples):
        by_task.setdefault(e.task, []).append(i)
    rng = random.Random(seed)
    pools: Dict[str, List[int]] = {t: [] for t in by_task}
    plan = []
    for stage in stages:
        if stage.name == "vision":
            continue
        tasks = [t for t in stage.tasks if t in by_task]
        weights = [len(by_task[t]) * TASK_WEIGHTS.get(t, 1.0) for t in tasks]
        for _ in range(stage.steps):
            task = rng.choices(tasks, weights)[0]
            if len(pools[task]) < BATCH:
                epoch = list(by_task[task])
                rng.shuffle(epoch)
                pools[task] += epoch
            plan.append((stage.name, pools[task][:BATCH]))
            pools[task] = pools[task][BATCH:]
    return plan


def train_language_model(trainer: Trainer, examples: Sequence[Example], pad_id: int, seed: int,
                         on_stage: Callable[[str, int], bool]) -> None:
    """AdamW over the curriculum (projector and language model; the tower is frozen), warm-up,
    then constant, then a linear decay over the last fifth. ``on_stage(name, steps)`` runs at the
    end of every stage and, as ``("check", CHECK_STEPS)``, after step ``CHECK_STEPS``; it returns
    False to stop there."""
    plan = batch_plan(examples, seed)
    model = trainer.model
    params = [p for p in model.parameters() if p.requires_grad] + list(trainer.heads.parameters())
    opt = torch.optim.AdamW(params, lr=LR, weight_decay=0.01, betas=(0.9, 0.98))
    total = len(plan)

    def rate(step: int) -> float:
        tail = total - total // 5
        decay = 1.0 if step < tail else max(0.05, 1.0 - (step - tail) / max(1, total - tail))
        return min(1.0, (step + 1) / WARMUP) * decay
    sched = torch.optim.lr_scheduler.LambdaLR(opt, rate)
    model.train()
    t0, losses, done = time.perf_counter(), [], 0
    for step, (stage, idx) in enumerate(plan):
        answer, probe = trainer.loss([examples[i] for i in idx], pad_id)
        opt.zero_grad(set_to_none=True)
        (answer + probe).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        losses.append((answer.item(), probe.item()))
        if (step + 1) % 100 == 0:
            a, p = (sum(x) / 100 for x in zip(*losses[-100:]))
            logger.info("step %d/%d (%s) answer loss %.4f probe loss %.4f (%.0fs)", step + 1, total, stage, a, p,
                        time.perf_counter() - t0)
        done += 1
        if step + 1 == CHECK_STEPS:
            model.eval()
            go_on = on_stage("check", CHECK_STEPS)
            model.train()
            if not go_on:
                break
        if step + 1 == total or plan[step + 1][0] != stage:
            model.eval()
            go_on = on_stage(stage, done)
            model.train()
            done = 0
            if not go_on:
                break
    model.eval()


StageRecord = Dict[str, Any]


def build_trained_llava(out_dir: str, size: str = "trained", seed: int = SEED,
                        stop_after: Optional[str] = None) -> List[StageRecord]:
    """Write the trained tiny LLaVA to ``out_dir`` (see the module docstring); returns each stage's
    record (name, steps, the SHA-256 of the data or weights at its end; ``check``: the weights after
    ``CHECK_STEPS`` language-model steps). ``stop_after`` (a stage name, ``data`` or ``check``)
    stops there, leaving the checkpoint unfinished."""
    logger.warning("training the known-skill LLaVA (about 7 CPU minutes) into %s", out_dir)
    threads = torch.get_num_threads()
    deterministic = torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(1)  # one thread: the same floating-point sums on every machine
    torch.use_deterministic_algorithms(True)
    rng_state = torch.random.get_rng_state()
    records: List[StageRecord] = []
    try:
        with tempfile.TemporaryDirectory(prefix="reform-train-") as work:
            tagged = training_samples(work, seed)
            tokenizer = train_tiny_tokenizer(vocab_size=LLAVA_SIZES[size]["vocab"], extra_special=("<image>",),
                                             corpus=corpus([s for s, _ in tagged]))
            config, processor = llava_parts(size, tokenizer)
            save_checkpoint(seeded_model(lambda: LlavaForConditionalGeneration(config), size, seed=seed),
                            processor, tokenizer, out_dir)
            interface, preprocessor = get_model("llava", {"model_name": out_dir, "dtype": "float32"})
            examples, frames = encode(interface, preprocessor, tagged)
            del tagged
            records.append({"name": "data", "sequences": len(examples), "sha256": data_sha256(examples, frames)})
            logger.info("data: %d sequences, %d distinct frames", len(examples), len(frames))
            if stop_after == "data":
                return records
            model = interface.model
            torch.manual_seed(seed)
            pretrain_vision(model, frames, STAGES[0].steps, seed)
            records.append({"name": STAGES[0].name, "steps": STAGES[0].steps, "sha256": state_sha256(model)})
            if stop_after == STAGES[0].name:
                return records
            trainer = Trainer(model)
            keys = sorted(frames)
            for i in range(0, len(keys), 256):
                chunk = keys[i:i + 256]
                feats = trainer.tower_features(torch.stack([frames[k][0] for k in chunk]))
                trainer.features.update(zip(chunk, feats))
            frames.clear()

            def on_stage(name: str, steps: int) -> bool:
                records.append({"name": name, "steps": steps, "sha256": state_sha256(model)})
                logger.info("stage %s done (%d steps)", name, steps)
                return name != stop_after
            train_language_model(trainer, examples, tokenizer.pad_token_id, seed, on_stage)
            if stop_after is None:
                save_checkpoint(model, interface.processor, interface.tokenizer, out_dir)
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic)
        torch.random.set_rng_state(rng_state)
    return records


def _build(out_dir: str, size: str) -> None:
    build_trained_llava(out_dir, size)


register_tiny_builder("llava", _build, version=VERSION, size="trained")

#: where the shipped checkpoint lives (under ``models/checkpoints``)
SHIPPED_NAME = "llava-tiny-trained"


#: the CPU's instruction-set extensions that torch's and oneDNN's kernels dispatch on beyond
#: ``cpu_capability`` (two AVX512 machines, one with AMX or AVX512-FP16, retrained the vision
#: stage to other weights: the capability alone did not tell them apart)
ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni", "avx512_bf16",
             "avx512_fp16", "avx_vnni", "amx_tile", "amx_bf16", "amx_int8")


def cpu_isa() -> List[str]:
    """The ``ISA_FLAGS`` this CPU reports (``/proc/cpuinfo``); [] where unreadable."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return []
    return [flag for flag in ISA_FLAGS if flag in flags]


def build_platform() -> Dict[str, Any]:
    """What bit-for-bit reproduction depends on: the torch version and the CPU kernels it picks
    (one thread and deterministic algorithms remove every other source of variation): its
    capability level and the instruction-set extensions the kernels may use."""
    return {"torch": torch.__version__.split("+")[0], "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "isa": cpu_isa()}


def ship(out_dir: str, stages: Sequence[StageRecord]) -> Dict[str, Any]:
    """Record ``out_dir``'s file hashes and the stage fingerprints as the shipped ``llava/trained``
    entry of the manifest."""
    entry = {"dir": os.path.relpath(out_dir, SHIPPED_DIR), "version": VERSION, "built_with": build_platform(),
             "stages": list(stages),
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
