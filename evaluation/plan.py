"""Planning a run: the samples, the run identity, the file names and the batch plan.

Everything here is a pure function of the validated ``RunConfig`` and the built samples, so
every rank computes the same plan without talking to the others.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..build import build_dataset
from ..build.registry import Builder, get_builder_class, options_by_content
from ..build.registry import read_dataset_config as read_config_file
from ..models import builtin_checkpoint_dir, checkpoint_source, identity_env, needs_image
from ..models.tiny import sha256_file
from .config import ModelConfig, RunConfig
from ..utils.commit import NAME_MAX
from ..utils.errors import ReformError
from ..utils.fingerprint import samples_fingerprint
from ..utils.secrets import drop_secrets, json_default

Key = Tuple[str, int]


@dataclass
class RunPlan:
    """What one run computes and where it goes."""

    config: RunConfig
    samples: List[Dict[str, Any]]
    builder: Builder
    digests: List[str]
    fingerprint: str
    run_id: str
    identity: Dict[str, Any]
    config_path: Optional[str]
    prediction_file: str
    shard_dir: str
    timing: Dict[str, float] = field(default_factory=lambda: {"forward_s": 0.0})
    cache_stats: Dict[str, int] = field(default_factory=dict)
    #: per-sample digests of the item without how it is asked (``utils.fingerprint.item_fields``)
    item_digests: List[str] = field(default_factory=list)
    #: what the model reported about itself and its prompts (``BaseInterface.provenance``)
    provenance: Dict[str, Any] = field(default_factory=dict)
    _index: Dict[Key, int] = field(default_factory=dict, repr=False)
    #: a hub id's resolved snapshot (id, revision, commit, folder), recorded in the run info
    checkpoint_source: Optional[Dict[str, Any]] = None
    #: per-sample hash of its images' content (``utils.fingerprint.images_digest``), made with the
    #: fingerprint: each record's ``trace.image_sha``
    image_digests: List[Optional[str]] = field(default_factory=list)

    def key(self, sample: Dict[str, Any]) -> Key:
        return (str(sample["sample_id"]), int(sample["dup_index"]))

    def release_samples(self) -> None:
        """Drop the built samples (and what is indexed by them) once the records are merged."""
        self.samples, self.digests, self.item_digests, self.image_digests, self._index = [], [], [], [], {}

    def index_of(self, key: Key) -> Optional[int]:
        if not self._index and self.samples:  # (made by make_plan; a plan built by hand makes it here)
            self._index = {self.key(s): i for i, s in enumerate(self.samples)}
        return self._index.get(key)

    def digest_of(self, key: Key) -> str:
        i = self.index_of(key)
        return self.digests[i] if i is not None else ""

    def sample_sha_of(self, key: Key) -> Optional[str]:
        i = self.index_of(key)
        return self.digests[i][:16] if i is not None else None

    def item_sha_of(self, key: Key) -> Optional[str]:
        i = self.index_of(key)
        return self.item_digests[i][:16] if i is not None and i < len(self.item_digests) else None

    def image_sha_of(self, key: Key) -> Optional[str]:
        i = self.index_of(key)
        return self.image_digests[i] if i is not None and i < len(self.image_digests) else None

    @property
    def sample_sha(self) -> Dict[Key, str]:
        return {self.key(s): d[:16] for s, d in zip(self.samples, self.digests)}

    @property
    def item_sha(self) -> Dict[Key, str]:
        return {self.key(s): d[:16] for s, d in zip(self.samples, self.item_digests)}


def read_dataset_config(cfg: RunConfig) -> Tuple[Optional[str], Dict[str, Any]]:
    """(path, content) of the dataset config, its keys and values checked by the builder."""
    return read_config_file(cfg.dataset.config, cfg.dataset.name)


def build_samples(cfg: RunConfig, config_path: Optional[str]) -> Tuple[List[Dict[str, Any]], Builder]:
    d, g = cfg.dataset, cfg.generation
    assert d.formulation is not None  # RunConfig.validated fills in the benchmark's default
    return build_dataset(d.name, d.formulation, config_path, inference_method=g.infer_method,
                         in_context_sample=d.in_context_sample, random_instruct=d.random_instruct,
                         data_duplication=d.duplication, shuffle_options=d.shuffle_options,
                         option_mark=d.option_mark, seed=g.seed, subsample=d.subsample,
                         extra_options=dict(d.options), image_ablation=d.image_ablation,
                         image_required=needs_image(cfg.model.family))


def identity(cfg: RunConfig, config_content: Dict[str, Any], data_fingerprint: str) -> Tuple[str, Dict[str, Any]]:
    """(hash, identity dict) of everything that changes the predictions: model, checkpoint,
    reformulation and generation settings, the dataset config's content and a fingerprint of the
    built samples and their images. Credentials and placement options are left out (a new API
    key, or more GPUs, must not start a new run), and so is ``--dataset_subsample``: the samples
    it drew are in the fingerprint, so 100 and 1000 of a 100-trial set are one run."""
    m, d, g = cfg.model, cfg.dataset, cfg.generation
    ident = {
        "model": m.family, "model_name": m.name, "model_type": m.type, "half_evaluation": m.half_evaluation,
        "model_option": cfg.model_options_for_identity(), "model_env": identity_env(m.family),
        "checkpoint": checkpoint_fingerprint(m),
        "dataset_name": d.name, "formulation": d.formulation,
        "dataset_option": options_by_content(get_builder_class(d.name), d.options),  # (paths: by content)
        "dataset_duplication": d.duplication, "in_context_sample": d.in_context_sample,
        "random_instruct": d.random_instruct, "shuffle_options": d.shuffle_options, "option_mark": d.option_mark,
        "history": d.history, "save_images": d.save_images,  # (--dataset_subsample: data_fingerprint)
        "context_policy": d.context_policy,
        **({"image_ablation": d.image_ablation} if d.image_ablation else {}),  # (absent: older identities kept)
        "infer_method": g.infer_method, "temperature": g.temperature, "max_new_tokens": g.max_new_tokens,
        "num_samples": g.num_samples, "seed": g.seed,
        "dataset_config_content": config_content, "data_fingerprint": data_fingerprint,
    }
    ident = drop_secrets(ident)
    blob = json.dumps(ident, sort_keys=True, default=json_default).encode("utf-8")
    return hashlib.sha256(blob).hexdigest()[:12], ident


#: the identity entries that name the model (what the response cache is keyed by)
MODEL_IDENTITY_KEYS = ("model", "model_name", "model_type", "half_evaluation", "model_option", "model_env",
                       "checkpoint")


def model_identity(ident: Dict[str, Any], loaded_checkpoint: Any = None) -> str:
    """A hash of the model's part of the run identity plus the files of the checkpoint the
    interface actually loaded (a 'tiny' or hub name resolves to a directory only at load time)."""
    body = {k: ident.get(k) for k in MODEL_IDENTITY_KEYS}
    body["loaded_checkpoint"] = loaded_checkpoint
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=json_default).encode("utf-8")).hexdigest()


def checkpoint_fingerprint(model: ModelConfig) -> Optional[List[Tuple[str, int, Any]]]:
    """The files of the checkpoint the name stands for: a local directory's (file, size, mtime),
    so new weights in the same directory are a new run, never the old predictions; a built-in
    name's (``tiny``, ``tiny-trained``) directory by content, (file, size, SHA-256), since the
    name stays while its weights may change (a new recipe, a shipped copy rebuilt elsewhere)."""
    name = model.name
    try:
        builtin = builtin_checkpoint_dir(model.family, name, model.options)
    except ReformError:
        builtin = None  # the model's own load reports it, in its words
    if builtin is not None:
        return sorted((n, os.path.getsize(os.path.join(builtin, n)), sha256_file(os.path.join(builtin, n)))
                      for n in os.listdir(builtin) if os.path.isfile(os.path.join(builtin, n)))
    hub = checkpoint_source(model.family, name)  # a hub id: the snapshot folder it resolves to now
    return directory_fingerprint(hub.path if hub is not None else name)


def directory_fingerprint(path: Optional[str]) -> Optional[List[Tuple[str, int, int]]]:
    """(file, size, mtime) of every file of a local directory, or None when ``path`` is not one."""
    if not path or not os.path.isdir(str(path)):
        return None
    out = []
    for root, _, files in os.walk(str(path)):
        for fname in sorted(files):
            full = os.path.join(root, fname)
            try:
                st = os.stat(full)
            except OSError:
                continue
            out.append((os.path.relpath(full, str(path)), st.st_size, st.st_mtime_ns))
    return sorted(out)


def slug(text: str, limit: int = 40) -> str:
    """A file-name-safe form of ``text``; one that had to be changed or cut carries a hash of the
    whole text, so two names that differ anywhere never share a slug."""
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in str(text)).strip(".") or "_"
    if safe == text and len(safe) <= limit:
        return safe
    digest = hashlib.sha256(str(text).encode("utf-8", "surrogatepass")).hexdigest()[:8]
    return f"{safe[:limit]}-{digest}"


#: the longest prediction-file stem (bytes): the longest name derived from it,
#: ``<stem>.scored-<hash>.per_sample.json``, then fits a 255-byte file name
MAX_STEM_BYTES = NAME_MAX - len(".scored-00000000.per_sample.json")


def prediction_path(cfg: RunConfig, run_id: str) -> str:
    """``<dataset>_<formulation>_<method>_<family>_<model>_<run id>.json``; a stem longer than
    ``MAX_STEM_BYTES`` has its descriptive part cut (the run id, a hash of everything that
    names the run, stays whole), so no result, report or temporary of the run has a name the
    file system refuses, and the same run always gets the same name."""
    tag = slug(str(cfg.model.name or cfg.model.family).rstrip("/").replace(os.sep, "_"))
    d = cfg.dataset
    prefix = f"{d.name}_{d.formulation}_{cfg.generation.infer_method}_{cfg.model.family}_{tag}"
    room = MAX_STEM_BYTES - len(f"_{run_id}".encode("utf-8"))
    if len(prefix.encode("utf-8", "surrogatepass")) > room:
        prefix = prefix.encode("utf-8", "surrogatepass")[:room].decode("utf-8", "ignore")
    return os.path.join(cfg.output.output_dir, f"{prefix}_{run_id}.json")


def make_plan(cfg: RunConfig, config_path: Optional[str], content: Dict[str, Any]) -> RunPlan:
    """Build the samples (from the dataset config ``read_dataset_config`` read), fingerprint them
    and name the run."""
    samples, builder = build_samples(cfg, config_path)
    if not samples:
        raise ReformError(f"{cfg.dataset.name}: the build produced no samples (check the dataset config and "
                          "--dataset_option values)")
    image_digests: List[Optional[str]] = []
    fingerprint, digests, item_digests = samples_fingerprint(samples, image_digests)
    run_id, ident = identity(cfg, content, fingerprint)
    pred = prediction_path(cfg, run_id)
    hub = checkpoint_source(cfg.model.family, cfg.model.name)
    plan = RunPlan(cfg, samples, builder, digests, fingerprint, run_id, ident, config_path, pred,
                   os.path.join(cfg.output.output_dir, f".shards_{run_id}"), item_digests=item_digests,
                   image_digests=image_digests, checkpoint_source=hub.record() if hub is not None else None)
    plan.index_of(plan.key(samples[0]))  # the key index, made once before any worker thread reads it
    return plan


# -- the batch plan ---------------------------------------------------------------------------
def dependencies(samples: Sequence[Dict[str, Any]], history_mode: str) -> List[List[Key]]:
    """For each sample, the keys of the samples whose predictions its history needs (model
    history only: reference history needs none)."""
    out: List[List[Key]] = []
    for s in samples:
        deps: List[Key] = []
        if history_mode == "model":
            for turn in s.get("history", []):
                if "source_sample_id" in turn:
                    deps.append((str(turn["source_sample_id"]), int(s.get("dup_index", 0))))
        out.append(deps)
    return out


def rank_groups(groups: List[List[int]], rank: int, world: int) -> List[int]:
    """This rank's sample indices: every world-th group (a chat stays whole on one rank),
    interleaved by position in the group so that a batch can hold turn t of several chats."""
    mine = groups[rank::world]
    order: List[int] = []
    depth = max((len(g) for g in mine), default=0)
    for pos in range(depth):
        order.extend(g[pos] for g in mine if pos < len(g))
    return order


def plan_batches(order: Sequence[int], deps: Dict[int, List[Key]], keys: Dict[int, Key], done: set,
                 batch_size: int) -> List[List[int]]:
    """Cut ``order`` into batches of at most ``batch_size`` in which every sample's dependencies
    are finished before the batch starts (in ``done`` or in an earlier batch): a batch never holds
    turn t and turn t+1 of one chat, whatever the batch size. Samples keep their order otherwise,
    so data without dependencies is cut into plain consecutive batches."""
    finished = set(done)
    pending = list(order)
    batches: List[List[int]] = []
    while pending:
        batch: List[int] = []
        rest: List[int] = []
        for j, i in enumerate(pending):
            if len(batch) == batch_size:
                rest.extend(pending[j:])
                break
            if all(k in finished for k in deps.get(i, ())):
                batch.append(i)
            else:
                rest.append(i)
        if not batch:
            missing = next(k for k in deps[rest[0]] if k not in finished)
            raise ReformError(f"sample {keys[rest[0]][0]}: history needs the prediction of {missing[0]}, "
                              "which is not part of this run (it must come earlier in its chat)")
        batches.append(batch)
        finished.update(keys[i] for i in batch)
        pending = rest
    return batches
