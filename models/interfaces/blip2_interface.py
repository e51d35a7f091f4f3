"""BLIP-2 (``Salesforce/blip2-opt-*``, ``Salesforce/blip2-flan-t5-*``).

Why this family needs its own encoding: BLIP-2 turns one image into ``num_query_tokens``
Q-Former outputs that replace as many ``<image>`` tokens in the language model's input
(the HF processor prepends them, one image per prompt). The model itself has no limit on
the number of images: it scatters the query outputs of *all* images of a batch, in order,
into the ``<image>`` runs. So this interface builds the token ids itself:

* **Multi-image (our choice, not BLIP-2's training setup):** every image is encoded
  separately by the vision tower + Q-Former and its ``num_query_tokens`` query outputs are
  placed where the prompt has that image's placeholder. With one image in front of the text
  this is exactly the HF processor's layout (``<image>*n <s> Question: ... Answer:``); with
  several images the model sees several query blocks, which it was never trained on.
  The preprocessor puts all images in front of the dialogue unless the history places them.
* **Decoder-only LMs (OPT):** candidates are scored from the shared prefix cache by the
  language model alone (``candidate_model``), since BLIP-2's own forward always re-encodes
  the images.
* **Encoder-decoder LMs (Flan-T5):** images + prompt go to the encoder once; all candidates
  are scored on the decoder (``<pad>`` start token, then the candidate tokens) against the
  shared encoder output; candidate tokens are the candidate tokenized alone (no EOS).

Every prompt needs at least one image (the model always encodes pixel values).
"""
from __future__ import annotations

import logging
from typing import Any, Dict, List, Sequence, Tuple

import torch
from PIL import Image

from ...utils.schema import IMAGE_TOKEN
from .. import register_model
from ..hf_base import HFBaseInterface
from .base_interface import CandidateScore
from ..outputs import GenText
from ..tiny import register_tiny_builder, train_tiny_tokenizer
from ..tiny_zoo import TEXT_SIZES, VISION_SIZES, save_checkpoint, seeded_model
from ...utils.errors import ReformError
from ...utils.preprocessors import ConvProcessor, parse_roles

logger = logging.getLogger(__name__)


class ImagesFirstProcessor:
    """``ConvProcessor`` output with the current query's images moved in front of the whole
    prompt (BLIP's training layout) when the history holds no image placeholders."""

    def __init__(self, conv: ConvProcessor) -> None:
        self.conv = conv

    def __call__(self, sample: Dict[str, Any]) -> str:
        text = self.conv(sample)
        if any(IMAGE_TOKEN in t.get("value", "") for t in sample.get("history", [])):
            return text
        n = text.count(IMAGE_TOKEN)
        if not n:
            return text
        return IMAGE_TOKEN * n + text.replace(IMAGE_TOKEN + "\n", "").replace(IMAGE_TOKEN, "")


@register_model("blip2")
class Blip2Interface(HFBaseInterface):
    """BLIP-2: ViT + Q-Former (``num_query_tokens`` queries per image) + OPT or Flan-T5."""

    family = "blip2"
    needs_image = True  # every prompt encodes pixel values (``_encode``)
    model_types = ("blip-2",)
    #: OPT derives its (learned, absolute) positions from the attention mask itself
    position_source = "model"
    option_names = ("roles",)

    # ------------------------------------------------------------------ prompts / inputs
    @property
    def seq2seq(self) -> bool:
        """True for encoder-decoder language models (Flan-T5)."""
        return not self.model.config.use_decoder_only_language_model

    def default_roles(self) -> Tuple[str, str]:
        """BLIP-2's zero-shot VQA prompts (paper, section 4.3; LAVIS's VQAv2 eval configs):
        ``Question: {} Answer:`` for OPT, ``Question: {} Short answer:`` for Flan-T5."""
        return ("Question", "Short answer") if self.seq2seq else ("Question", "Answer")

    def make_preprocessor(self, config: Dict[str, Any]) -> ImagesFirstProcessor:
        """``<image>... Question: <instruction + question> Answer:`` (``default_roles``; the
        checkpoints have no chat template), earlier turns as further Question/Answer pairs."""
        conv = ConvProcessor(roles=parse_roles(config.get("roles"), self.default_roles()), sep_style="one",
                             seps=(" ",), system_msg=config.get("system_msg", ""),
                             response_prefix=config.get("response_prefix"))
        return ImagesFirstProcessor(conv)

    @property
    def image_token(self) -> str:
        """The processor keeps its image token as an ``AddedToken``; its text is ``<image>``."""
        tok = getattr(self.processor, "image_token", IMAGE_TOKEN)
        return str(getattr(tok, "content", tok))

    def prefix_cache(self, out: Any) -> Any:
        """BLIP-2's output keeps the language model's cache in ``language_model_outputs``."""
        return out.language_model_outputs.cache

    def candidate_model(self) -> Any:
        """BLIP-2's forward needs ``pixel_values``; candidates run on the language model."""
        return self.model.language_model

    def _image_token_id(self) -> int:
        cfg = self.model.config
        tid = getattr(cfg, "image_token_id", None)
        return int(tid if tid is not None else cfg.image_token_index)

    def _text_ids(self, text: str, i: int) -> List[int]:
        """Prompt ids with each image placeholder expanded to ``num_query_tokens`` image
        tokens; a leading image run goes before BOS, as the HF processor puts it."""
        nq = int(self.model.config.num_query_tokens)
        img = self._image_token_id()
        ids = self.tokenizer(text, add_special_tokens=self.adds_bos())["input_ids"]
        out: List[int] = []
        for t in ids:
            out.extend([img] * nq if t == img else [t])
        bos = self.tokenizer.bos_token_id
        if bos is not None and out and out[0] == bos:
            lead = 1
            while lead < len(out) and out[lead] == img:
                lead += 1
            out = out[1:lead] + [bos] + out[lead:]
        return out

    def _qformer_inputs(self, texts: List[str], counts: List[int]) -> Dict[str, torch.Tensor]:
        """Extra Q-Former inputs, one row per image (InstructBLIP); none for BLIP-2."""
        return {}

    def _encode(self, texts: List[str], images: List[Image.Image]) -> Dict[str, torch.Tensor]:
        """input_ids (left padded) with query-token runs, pixel_values of all images in order."""
        rows = [self._text_ids(t, i) for i, t in enumerate(texts)]
        img = self._image_token_id()
        nq = int(self.model.config.num_query_tokens)
        counts = [sum(1 for t in r if t == img) // nq for r in rows]
        for i, c in enumerate(counts):
            if c == 0:
                raise ReformError(f"model {self.label}: {self._sid(i)}: BLIP-2 style models need at least one "
                                  "image per prompt")
        if sum(counts) != len(images):
            raise ReformError(f"model {self.label}: {sum(counts)} image placeholders but {len(images)} images")
        width = max(len(r) for r in rows)
        pad = self.tokenizer.pad_token_id or 0
        ids = torch.full((len(rows), width), pad, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for r, row in enumerate(rows):
            ids[r, width - len(row):] = torch.tensor(row, dtype=torch.long)
            mask[r, width - len(row):] = 1
        pixels = self.processor.image_processor(images, return_tensors="pt")["pixel_values"]
        self.trace_encoded(texts, {"input_ids": ids, "attention_mask": mask, "pixel_values": pixels}, images, counts)
        enc: Dict[str, torch.Tensor] = {"input_ids": ids.to(self.device), "attention_mask": mask.to(self.device),
                                        "pixel_values": pixels.to(self.device, self.dtype)}
        enc.update(self._qformer_inputs(texts, counts))
        return enc

    # ------------------------------------------------------------------ generation
    def _generate(self, texts: List[str], images: List[List[Image.Image]], hf_kwargs: Dict[str, Any],
                  offset: int = 0) -> List[GenText]:
        if not self.seq2seq:
            return super()._generate(texts, images, hf_kwargs, offset)
        enc = self._encode(texts, [im for ims in images for im in ims])
        for i in range(len(texts)):
            self._check_context(int(enc["attention_mask"][i].sum()), offset + i, "prompt")
        out = self.model.generate(**enc, **hf_kwargs)  # decoder tokens only, after the start token
        return self.decode_generated(out[:, 1:])

    # ------------------------------------------------------------------ likelihood
    def candidate_ids(self, prompt_text: str, candidate: str) -> List[int]:
        """Decoder-only: the base's boundary rule; encoder-decoder: the candidate alone."""
        if not self.seq2seq:
            return super().candidate_ids(prompt_text, candidate)
        return list(self.tokenizer(candidate.strip(), add_special_tokens=False)["input_ids"])

    def _decoder_start(self) -> int:
        cfg = self.model.config.text_config
        start = cfg.decoder_start_token_id
        return int(start if start is not None else cfg.pad_token_id)

    def _predict_batch(self, images_list: Sequence[Sequence[Any]], prompts: Sequence[Any],
                       candidates_list: Sequence[Sequence[str]], offset: int = 0) -> List[List[CandidateScore]]:
        """Encoder-decoder: one encoder pass for the batch (left-padded; T5's relative
        position bias and the padding mask make it the one-sample pass row by row), then each
        candidate chunk of all samples as decoder rows over their sample's encoder output."""
        if not self.seq2seq:
            return super()._predict_batch(images_list, prompts, candidates_list, offset)
        preps = [self._prepare(ims, p, c, offset + i)
                 for i, (ims, p, c) in enumerate(zip(images_list, prompts, candidates_list))]
        enc = self._encode([t for t, _, _ in preps], [im for _, ims, _ in preps for im in ims])
        for i in range(len(preps)):
            self._check_context(int(enc["attention_mask"][i].sum()), offset + i, "prompt")
        start = self._decoder_start()
        dec = torch.full((len(preps), 1), start, dtype=torch.long, device=self.device)
        out = self.model(**enc, decoder_input_ids=dec, use_cache=False)
        enc_h = out.language_model_outputs.encoder_last_hidden_state
        cand_lists = [c for _, _, c in preps]
        k_max = max(len(c) for c in cand_lists)
        chunk = int(self.config.get("candidate_batch_size") or k_max)
        scores: List[List[CandidateScore]] = [[] for _ in preps]
        for s in range(0, k_max, chunk):
            rows = [(b, c) for b, cands in enumerate(cand_lists) for c in cands[s:s + chunk]]
            index = torch.tensor([b for b, _ in rows], dtype=torch.long, device=self.device)
            got = self._score_decoder(enc_h[index], enc["attention_mask"][index], [c for _, c in rows], start)
            for (b, _), g in zip(rows, got):
                scores[b].append(g)
        return scores

    def _score_decoder(self, enc_h: torch.Tensor, enc_mask: torch.Tensor, cand_ids: List[List[int]],
                       start: int) -> List[CandidateScore]:
        """All candidates as right-padded decoder rows over the shared encoder output."""
        from transformers.modeling_outputs import BaseModelOutput

        n, max_len = len(cand_ids), max(len(c) for c in cand_ids)
        pad = self.tokenizer.pad_token_id or 0
        targets = torch.full((n, max_len), pad, dtype=torch.long, device=self.device)
        for r, c in enumerate(cand_ids):
            targets[r, :len(c)] = torch.tensor(c, dtype=torch.long)
        dec_in = torch.cat([torch.full((n, 1), start, dtype=torch.long, device=self.device), targets[:, :-1]], 1)
        lm_out = self.model.language_model(
            encoder_outputs=BaseModelOutput(last_hidden_state=enc_h.expand(n, -1, -1)),
            attention_mask=enc_mask.expand(n, -1), decoder_input_ids=dec_in, use_cache=False)
        lp = torch.log_softmax(lm_out.logits.float(), dim=-1).gather(-1, targets[:, :, None]).squeeze(-1)
        lengths = torch.tensor([len(c) for c in cand_ids], device=self.device)
        keep = torch.arange(max_len, device=self.device)[None, :] < lengths[:, None]
        return [CandidateScore(float(v), int(n)) for v, n in zip((lp * keep).sum(-1).tolist(), lengths.tolist())]

    @torch.inference_mode()
    def score_full_sequence(self, images: Sequence[Any], prompt: Any,
                            candidates: Sequence[str]) -> List[CandidateScore]:
        """Reference: one full forward (images re-encoded) per candidate; decoder-scored for
        encoder-decoder models."""
        if not self.seq2seq:
            return super().score_full_sequence(images, prompt, candidates)
        text, imgs, cand_ids = self._prepare(images, prompt, candidates, 0)
        enc = self._encode([text], imgs)
        start = self._decoder_start()
        scores = []
        for ids in cand_ids:
            c = torch.tensor([ids], dtype=torch.long, device=self.device)
            dec = torch.cat([torch.tensor([[start]], device=self.device), c[:, :-1]], dim=1)
            logits = self.model(**enc, decoder_input_ids=dec, use_cache=False).logits[0].float()
            lp = torch.log_softmax(logits, dim=-1).gather(-1, c[0, :, None]).sum()
            scores.append(CandidateScore(float(lp), len(ids)))
        return scores


# ---------------------------------------------------------------------------------- tiny
def blip_vision_qformer(size: str) -> Dict[str, Any]:
    """Vision tower + Q-Former configs shared by the tiny BLIP-2 and InstructBLIP builders;
    ``num_query_tokens`` is 4 at ``tiny`` (32 in real checkpoints)."""
    v = VISION_SIZES[size]
    vision = dict(hidden_size=v["hidden"], intermediate_size=v["mlp"], num_hidden_layers=v["layers"],
                  num_attention_heads=v["heads"], image_size=v["image"], patch_size=v["patch"],
                  initializer_range=0.02)
    qformer = dict(hidden_size=v["hidden"], num_hidden_layers=2, num_attention_heads=v["heads"],
                   intermediate_size=v["mlp"], encoder_hidden_size=v["hidden"], cross_attention_frequency=1,
                   vocab_size=TEXT_SIZES[size]["vocab"] + 16)
    return {"vision": vision, "qformer": qformer, "num_query": 4 if size == "tiny" else 32}


def blip_text_config(tok: Any, size: str, seq2seq: bool) -> Any:
    """Tiny OPT (decoder-only) or T5 (encoder-decoder) language model config."""
    from transformers import OPTConfig, T5Config

    t = TEXT_SIZES[size]
    if seq2seq:
        return T5Config(vocab_size=len(tok), d_model=t["hidden"], d_kv=t["hidden"] // t["heads"], d_ff=t["mlp"],  # type: ignore[call-arg]  # transformers' config stubs omit what its **kwargs take
                        num_layers=t["layers"], num_heads=t["heads"], feed_forward_proj="gated-gelu",
                        pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                        decoder_start_token_id=tok.pad_token_id, tie_word_embeddings=False)
    return OPTConfig(vocab_size=len(tok), hidden_size=t["hidden"], ffn_dim=t["mlp"], num_hidden_layers=t["layers"],
                     num_attention_heads=t["heads"], max_position_embeddings=2048, word_embed_proj_dim=t["hidden"],
                     bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                     tie_word_embeddings=False)


def blip_image_processor(size: str) -> Any:
    """BLIP image processor (resize to the tower's square side, CLIP normalisation)."""
    from transformers.models.blip.image_processing_pil_blip import BlipImageProcessorPil

    side = VISION_SIZES[size]["image"]
    return BlipImageProcessorPil(size={"height": side, "width": side})


def _build_blip2(out_dir: str, size: str, seq2seq: bool) -> None:
    from transformers import Blip2Config, Blip2ForConditionalGeneration, Blip2Processor

    tok = train_tiny_tokenizer(vocab_size=TEXT_SIZES[size]["vocab"], extra_special=("<image>",))
    parts = blip_vision_qformer(size)
    config = Blip2Config(vision_config=parts["vision"], qformer_config=parts["qformer"],
                         text_config=blip_text_config(tok, size, seq2seq).to_dict(),
                         num_query_tokens=parts["num_query"], image_token_index=tok.convert_tokens_to_ids("<image>"))
    model = seeded_model(lambda: Blip2ForConditionalGeneration(config), size)
    processor = Blip2Processor(image_processor=blip_image_processor(size), tokenizer=tok,
                               num_query_tokens=parts["num_query"])
    save_checkpoint(model, processor, tok, out_dir)


def build_tiny_blip2(out_dir: str, size: str = "tiny") -> None:
    """Random Blip2ForConditionalGeneration with an OPT language model."""
    _build_blip2(out_dir, size, seq2seq=False)


def build_tiny_blip2_t5(out_dir: str, size: str = "tiny") -> None:
    """Random Blip2ForConditionalGeneration with a (Flan-)T5 encoder-decoder language model."""
    _build_blip2(out_dir, size, seq2seq=True)


register_tiny_builder("blip2", build_tiny_blip2, version="1")
register_tiny_builder("blip2_t5", build_tiny_blip2_t5, version="1")
