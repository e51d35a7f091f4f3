"""Likelihood for ``HFBaseInterface``: prefix-shared candidate scoring.

Likelihood (``raw_batch_predict``), per sample (all samples of a batch together, below):

1. render the prompt (dialogue string, or chat messages through the processor's template),
   encode images + prompt once with ``use_cache=True``; keep the last logits and the cache;
2. candidate tokens = ``tokens(prompt + joiner + candidate)[len(tokens(prompt)):]`` when the
   prompt's tokens are a prefix of the joint tokens (else ``tokens(joiner + candidate)``
   without special tokens); ``joiner`` is one space unless the prompt ends in whitespace (a
   sample's texts in one tokenizer call, ``candidates_ids``: what they share encoded once);
3. run only the candidate tokens against the shared cache (in chunks of
   ``candidate_batch_size``), with one of two strategies:
   ``expand``: repeat the cache over the K candidates, one right-padded row each (causal
   attention means padding never affects the real tokens); ``packed``: all candidates in
   one row after the prefix with a block-diagonal causal 4D mask and positions restarting
   at the prefix length (no cache copies, no padding; ~10x cheaper on CPU).
   Sum the log-probabilities. Returns ``CandidateScore(logprob, num_tokens)``.

Batches (``_predict_batch``; one sample is a batch of one): step 1 runs once for all samples
of a batch, left-padded, with each row's positions counted over its real tokens (hooks
``prefix_position_inputs``, ``candidate_positions``), so every row computes what it computes
alone; step 3 then runs each candidate chunk of all samples in one pass. ``batch_groups``
splits a batch for families whose rows are not independent of padding (Mllama: by image
count).

``score_full_sequence`` is the naive reference (one full forward per candidate, images
included), used by tests and ``bench/likelihood.py``.
"""
from __future__ import annotations

import copy
import logging
from typing import Any, Dict, List, Sequence, Tuple

import torch
from PIL import Image

from .hf_state import HFState
from .interfaces.base_interface import CandidateScore
from .token_batches import BatchTokenizer
from ..utils.errors import ReformError

logger = logging.getLogger(__name__)


def _joiner(prompt_text: str, candidate: str) -> str:
    """What goes between the prompt and a candidate: one space unless either side has one."""
    return "" if (not prompt_text or prompt_text[-1].isspace() or candidate[:1].isspace()) else " "


class HFLikelihoodMixin(HFState):
    """``raw_batch_predict`` and ``score_full_sequence`` of ``HFBaseInterface``, with the
    hooks a family overrides (positions, cache, candidate model, full-sequence inputs)."""

    #: how candidates share the prefix cache: ``expand`` (repeat the cache over K rows; works
    #: for every family) or ``packed`` (one row, block-diagonal 4D mask, explicit 1D
    #: positions; needs a family whose text model takes plain position_ids and custom
    #: 4D masks). Config ``likelihood_strategy`` overrides.
    likelihood_strategy: str = "expand"
    option_names: Tuple[str, ...] = ("candidate_batch_size", "likelihood_strategy", "batched_likelihood")
    #: whether likelihood may run a batch's prefixes as one left-padded pass
    batch_prefix: bool = True
    #: positions of a left-padded pass: ``mask`` (explicit position_ids, a row's real tokens
    #: counted from ``position_offset``) or ``model`` (the model derives them from the mask)
    position_source: str = "mask"
    position_offset: int = 0
    config: Dict[str, Any]

    def prompt_ids(self, prompt_text: str) -> List[int]:
        """``prompt_text``'s tokens, special tokens added (as ``candidate_ids`` splits them off):
        the last prompt's are kept, so a sample's candidates (and an engine handed the same
        tokens, ``--model vllm``) tokenize its prompt once, not once per candidate."""
        memo = getattr(self, "_prompt_ids_memo", None)
        if memo is not None and memo[0] == prompt_text:
            return memo[1]
        ids = list(self.tokenizer(prompt_text, add_special_tokens=True)["input_ids"])
        self._prompt_ids_memo = (prompt_text, ids)
        return ids

    def candidate_ids(self, prompt_text: str, candidate: str) -> List[int]:
        """The tokens ``candidate`` adds after the rendered prompt (see module docstring)."""
        joiner = _joiner(prompt_text, candidate)
        p = self.prompt_ids(prompt_text)
        j = self.tokenizer(prompt_text + joiner + candidate, add_special_tokens=True)["input_ids"]
        return self._after_prompt(p, list(j), joiner, candidate)

    def _after_prompt(self, p: List[int], j: List[int], joiner: str, candidate: str) -> List[int]:
        """The candidate's tokens from the prompt's (``p``) and the joint text's (``j``)."""
        if len(j) > len(p) and j[:len(p)] == p:
            return list(j[len(p):])
        logger.debug("prompt tokens are not a prefix of prompt+candidate for %r; encoding it alone", candidate)
        return list(self.tokenizer(joiner + candidate, add_special_tokens=False)["input_ids"])

    def token_batches(self) -> BatchTokenizer:
        """Several texts to token ids at once, each distinct piece once (``models.token_batches``);
        made once per interface."""
        made = getattr(self, "_token_batches", None)
        if made is None:
            made = self._token_batches = BatchTokenizer(self.tokenizer)
        return made

    def candidates_ids(self, prompt_text: str, candidates: Sequence[str]) -> List[List[int]]:
        """``candidate_ids`` of every candidate, the prompt's text tokenized once: the prompt and
        each prompt + candidate in one call that encodes the pieces they share (all but the last
        piece) once, where ``candidate_ids`` is not a family's own (which is then asked per candidate)."""
        if type(self).candidate_ids is not HFLikelihoodMixin.candidate_ids:
            return [self.candidate_ids(prompt_text, c) for c in candidates]
        joiners = [_joiner(prompt_text, c) for c in candidates]
        ids = self.token_batches().ids([prompt_text] + [prompt_text + j + c for j, c in zip(joiners, candidates)])
        self._prompt_ids_memo = (prompt_text, ids[0])
        return [self._after_prompt(ids[0], j, joiner, c) for j, joiner, c in zip(ids[1:], joiners, candidates)]

    def _prepare(self, images: Sequence[Any], prompt: Any, candidates: Sequence[str], i: int
                 ) -> Tuple[str, List[Image.Image], List[List[int]]]:
        text = self.render(prompt, i)
        imgs = self._images(images, i)
        self._check_images(text, len(imgs), i)
        if not candidates:
            raise ReformError(f"model {self.label}: {self._sid(i)}: no candidates to score")
        cand_ids = self.candidates_ids(text, [str(c) for c in candidates])
        for c, ids in zip(candidates, cand_ids):
            if not ids:
                raise ReformError(f"model {self.label}: {self._sid(i)}: candidate {c!r} has no tokens")
        return text, imgs, cand_ids

    @torch.inference_mode()
    def raw_batch_predict(self, images_list: Sequence[Sequence[Any]], prompts: Sequence[Any],
                          candidates_list: Sequence[Sequence[str]]) -> List[List[CandidateScore]]:
        """Prefix-shared scoring: one image+prompt pass, then all candidates from the shared
        KV cache. Batched (``batched_likelihood()``): one left-padded prefix pass for the whole
        batch and one candidate pass per chunk; else one prefix pass per sample. Summed
        log-probs; normalisation is the metrics' job."""
        if len(prompts) > 1 and self.batched_likelihood():
            def run(g: List[int]) -> List[List[CandidateScore]]:
                if len(g) == 1:
                    return [self._predict_one(images_list[g[0]], prompts[g[0]], candidates_list[g[0]], 0)]
                return self._predict_batch([images_list[i] for i in g], [prompts[i] for i in g],
                                           [candidates_list[i] for i in g])
            return self._by_groups(self.batch_groups(images_list), run)
        return [self._predict_one(ims, p, c, i)
                for i, (ims, p, c) in enumerate(zip(images_list, prompts, candidates_list))]

    def batched_likelihood(self) -> bool:
        """Whether a batch's prefixes run as one left-padded pass (per ``batch_groups``; config
        ``batched_likelihood``, default on)."""
        return self.batch_prefix and bool(self.config.get("batched_likelihood", True))

    # -- batched likelihood ----------------------------------------------------------------
    def prefix_position_inputs(self, enc: Dict[str, Any], mask: torch.Tensor) -> Dict[str, torch.Tensor]:
        """Position inputs of a left-padded prefix pass (hook): each real token at its index
        among the row's real tokens (+ ``position_offset``), exactly as in the unpadded
        one-sample pass; nothing when the model derives positions from the attention mask
        (``position_source = "model"``: Qwen2-VL's M-RoPE, OPT's learned positions)."""
        if self.position_source == "model":
            return {}
        pos = (mask.long().cumsum(-1) - 1).clamp(min=0) + self.position_offset
        return {"position_ids": pos}

    def candidate_positions(self, pos: torch.Tensor, index: torch.Tensor) -> Dict[str, torch.Tensor]:
        """Position inputs of candidate tokens (hook). ``pos`` (rows, length): each token's
        index in its sample's unpadded sequence (real prefix length + offset in its
        candidate); row r belongs to sample ``index[r]`` of the prefix pass. Default:
        ``pos + position_offset``, or nothing when the model derives positions from the mask;
        Qwen2-VL adds the sample's M-RoPE offset."""
        if self.position_source == "model":
            return {}
        return {"position_ids": pos + self.position_offset}

    def _predict_batch(self, images_list: Sequence[Sequence[Any]], prompts: Sequence[Any],
                       candidates_list: Sequence[Sequence[str]], offset: int = 0) -> List[List[CandidateScore]]:
        """All prefixes in one left-padded pass (explicit positions, so every row sees what
        its one-sample pass sees), then each chunk of every sample's candidates in one
        candidate pass over the batch cache (``packed``: one row per sample; ``expand``: one
        row per candidate, cache rows selected per candidate)."""
        preps = [self._prepare(ims, p, c, offset + i)
                 for i, (ims, p, c) in enumerate(zip(images_list, prompts, candidates_list))]
        enc = self._encode([t for t, _, _ in preps], [im for _, ims, _ in preps for im in ims])
        ids = enc["input_ids"]
        mask = enc.get("attention_mask")
        if mask is None:
            mask = torch.ones_like(ids)
        real = mask.long().sum(-1)
        for i, (_, _, cand_ids) in enumerate(preps):
            self._check_context(int(real[i]) + max(len(c) for c in cand_ids), offset + i,
                                "prompt + longest candidate")
        out = self.model(**enc, **self.prefix_position_inputs(enc, mask), use_cache=True, logits_to_keep=1)
        first_lp = torch.log_softmax(out.logits[:, -1].float(), dim=-1)
        self.after_prefix(out, enc)
        prefix_cache = self.prefix_cache(out)
        del out

        cand_lists = [c for _, _, c in preps]
        k_max = max(len(c) for c in cand_lists)
        chunk = int(self.config.get("candidate_batch_size") or k_max)
        strategy = self.strategy()
        scores: List[List[CandidateScore]] = [[] for _ in preps]
        n_chunks = (k_max + chunk - 1) // chunk
        for start in range(0, k_max, chunk):
            pieces = [c[start:start + chunk] for c in cand_lists]
            cache = prefix_cache if n_chunks == 1 else copy.deepcopy(prefix_cache)
            if strategy == "packed":
                got = self._score_packed(cache, first_lp, pieces, mask, real)
            else:
                got = self._score_expand(cache, first_lp, pieces, mask, real)
            for b, g in enumerate(got):
                scores[b].extend(g)
        return scores

    def select_candidate_rows(self, index: torch.Tensor) -> None:
        """Expand per-sample state of the batched prefix pass to candidate rows (hook; row r
        belongs to sample ``index[r]``; Mllama's last cross-attention mask row). Default: nothing."""

    def after_prefix(self, out: Any, enc: Dict[str, Any]) -> None:
        """Read per-row state the candidate pass needs from a prefix pass (hook; Qwen2-VL's
        ``rope_deltas``). Default: nothing."""

    def _score_packed(self, cache: Any, first_lp: torch.Tensor, pieces: List[List[List[int]]],
                            mask: torch.Tensor, real: torch.Tensor) -> List[List[CandidateScore]]:
        """``packed``: row b holds all of sample b's candidates after its (left-padded)
        prefix, each seeing the real prefix tokens and only its own earlier tokens (4D mask;
        positions restart at the real prefix length). No cache copies; rows are right-padded
        (a pad token sees only itself). The cache is consumed."""
        dev = self.device
        totals = [[float(first_lp[b, c[0]]) for c in cands] for b, cands in enumerate(pieces)]
        feeds = [[c[:-1] for c in cands] for cands in pieces]
        n_row = [sum(len(f) for f in fs) for fs in feeds]
        n = max(n_row)
        if n:
            bsz, p_len = mask.shape
            pad = self.tokenizer.pad_token_id or 0
            ids = torch.full((bsz, n), pad, dtype=torch.long, device=dev)
            pos = torch.zeros((bsz, n), dtype=torch.long, device=dev)
            seg = torch.full((bsz, n), -1, dtype=torch.long, device=dev)
            for b, fs in enumerate(feeds):
                flat = [t for f in fs for t in f]
                if not flat:
                    continue
                ids[b, :len(flat)] = torch.tensor(flat, dtype=torch.long)
                pos[b, :len(flat)] = torch.tensor([j for f in fs for j in range(len(f))], dtype=torch.long)
                seg[b, :len(flat)] = torch.tensor([r for r, f in enumerate(fs) for _ in f], dtype=torch.long)
            pos = pos + real[:, None].to(dev)
            idx = torch.arange(n, device=dev)
            causal = idx[None, :] <= idx[:, None]
            same = (seg[:, :, None] == seg[:, None, :]) & (seg[:, :, None] >= 0)
            own = (seg[:, :, None] < 0) & torch.eye(n, dtype=torch.bool, device=dev)[None]
            allowed = torch.cat([mask.bool()[:, None, :].expand(bsz, n, p_len) & (seg[:, :, None] >= 0),
                                 (same & causal[None]) | own], dim=-1)
            mask4d = torch.zeros(bsz, 1, n, p_len + n, dtype=self.dtype, device=dev)
            mask4d.masked_fill_(~allowed[:, None], torch.finfo(self.dtype).min)
            out = self.candidate_model()(input_ids=ids, attention_mask=mask4d, cache=cache, use_cache=True,
                                         **self.candidate_positions(pos, torch.arange(bsz, device=dev)))
            lp = torch.log_softmax(out.logits.float(), dim=-1)
            for b, cands in enumerate(pieces):
                off = 0
                for r, c in enumerate(cands):
                    m = len(c) - 1
                    if m:
                        tgt = torch.tensor(c[1:], dtype=torch.long, device=dev)
                        totals[b][r] += float(lp[b, off:off + m].gather(-1, tgt[:, None]).sum())
                    off += m
        return [[CandidateScore(s, len(c)) for s, c in zip(tot, cands)] for tot, cands in zip(totals, pieces)]

    def _score_expand(self, cache: Any, first_lp: torch.Tensor, pieces: List[List[List[int]]],
                            mask: torch.Tensor, real: torch.Tensor) -> List[List[CandidateScore]]:
        """``expand``: one right-padded row per candidate over a copy of its sample's cache
        row (causal attention keeps real tokens from seeing later pads; the attention mask
        hides the prefix's left padding). The cache is consumed."""
        dev = self.device
        rows = [(b, c) for b, cands in enumerate(pieces) for c in cands]
        if not rows:
            return [[] for _ in pieces]
        index = torch.tensor([b for b, _ in rows], dtype=torch.long, device=dev)
        lengths = torch.tensor([len(c) for _, c in rows], device=dev)
        max_len = int(lengths.max())
        pad = self.tokenizer.pad_token_id or 0
        targets = torch.full((len(rows), max_len), pad, dtype=torch.long, device=dev)
        for r, (_, c) in enumerate(rows):
            targets[r, :len(c)] = torch.tensor(c, dtype=torch.long)
        total = first_lp[index, targets[:, 0]]
        if max_len > 1:
            cache.batch_select_indices(index)
            self.select_candidate_rows(index)
            am = torch.cat([mask[index].to(dev), torch.ones(len(rows), max_len - 1, dtype=mask.dtype, device=dev)], 1)
            out = self.candidate_model()(input_ids=targets[:, :-1], attention_mask=am, cache=cache,
                                         use_cache=True,
                                         **self.candidate_positions(
                                             real.to(dev)[index][:, None] + torch.arange(max_len - 1, device=dev)[None],
                                             index))
            lp = torch.log_softmax(out.logits.float(), dim=-1)
            tok_lp = lp.gather(-1, targets[:, 1:, None]).squeeze(-1)
            keep = torch.arange(1, max_len, device=dev)[None, :] < lengths[:, None]
            total = total + (tok_lp * keep).sum(-1)
        flat = [CandidateScore(float(s), int(n)) for s, n in zip(total.tolist(), lengths.tolist())]
        out_lists: List[List[CandidateScore]] = []
        k = 0
        for cands in pieces:
            out_lists.append(flat[k:k + len(cands)])
            k += len(cands)
        return out_lists

    def _predict_one(self, images: Sequence[Any], prompt: Any, candidates: Sequence[str],
                     i: int) -> List[CandidateScore]:
        """One sample: the batched path with a batch of one (``i`` names it in errors)."""
        return self._predict_batch([images], [prompt], [candidates], offset=i)[0]

    def candidate_token_type(self, key: str) -> int:
        """Value of the per-token input ``key`` for candidate tokens in the full-sequence
        reference (hook): 0 (text); PaliGemma's suffix tokens are ``token_type_ids`` 1."""
        return 0

    def extend_full_inputs(self, full: Dict[str, Any], enc: Dict[str, Any], n_new: int) -> Dict[str, Any]:
        """Grow other inputs of the full-sequence reference by ``n_new`` candidate tokens
        (hook; Mllama's 4D ``cross_attention_mask``). Default: unchanged."""
        return full

    def prefix_cache(self, out: Any) -> Any:
        """The KV cache of the prefix pass's output (hook; BLIP-2 nests it in
        ``language_model_outputs``)."""
        return out.cache

    def candidate_model(self) -> Any:
        """The module that runs candidate tokens against the prefix cache (hook): the full
        model by default; families whose forward always needs the images (BLIP-2's
        ``pixel_values``) return their text model, which reads the same cache."""
        return self.model

    def strategy(self) -> str:
        """``packed`` or ``expand`` (see the class docstring); flash attention cannot take the
        custom 4D mask that packing needs, and packing needs explicit candidate positions
        (a family whose model derives them, like OPT, must expand): both then expand."""
        name = str(self.config.get("likelihood_strategy") or self.likelihood_strategy)
        if name not in ("packed", "expand"):
            raise ReformError(f"model {self.label}: unknown likelihood_strategy '{name}'; valid names: expand, packed")
        if name == "packed" and str(self.config.get("attn_implementation") or "").startswith("flash"):
            return "expand"
        if name == "packed" and not self.candidate_positions(torch.zeros(1, 1, dtype=torch.long),
                                                             torch.zeros(1, dtype=torch.long)):
            return "expand"
        return name

    @torch.inference_mode()
    def score_full_sequence(self, images: Sequence[Any], prompt: Any,
                            candidates: Sequence[str]) -> List[CandidateScore]:
        """Naive reference: one full forward (images included) per candidate, scoring the
        same candidate tokens as ``raw_predict``. Slow; for tests and benchmarks."""
        text, imgs, cand_ids = self._prepare(images, prompt, candidates, 0)
        enc = self._encode([text], imgs)
        p_len = enc["input_ids"].shape[1]
        scores = []
        for ids in cand_ids:
            full = dict(enc)
            c = torch.tensor([ids], dtype=torch.long, device=self.device)
            full["input_ids"] = torch.cat([enc["input_ids"], c], dim=1)
            if "attention_mask" in enc:
                full["attention_mask"] = torch.ones_like(full["input_ids"])
            # other per-token inputs (Qwen2-VL's mm_token_type_ids, token_type_ids) grow with
            # the candidate; its tokens are text, type 0 unless the family says otherwise
            for key, val in enc.items():
                if key not in ("input_ids", "attention_mask") and isinstance(val, torch.Tensor) \
                        and val.shape == enc["input_ids"].shape:
                    fill = self.candidate_token_type(key)
                    full[key] = torch.cat([val, val.new_full((1, len(ids)), fill)], dim=1)
            full = self.extend_full_inputs(full, enc, len(ids))
            logits = self.model(**full, use_cache=False).logits[0, p_len - 1:-1].float()
            lp = torch.log_softmax(logits, dim=-1).gather(-1, c[0, :, None]).sum()
            scores.append(CandidateScore(float(lp), len(ids)))
        return scores
