"""Token ids of a batch of rendered prompts with every distinct piece of text tokenized once.

Why: an engine handed token ids (``--model vllm``) leaves the tokenizing to the harness, and on
a benchmark whose prompts share a long instruction (iWISDM's task description, the same for
every trial of a batch) the fast tokenizer spent most of its time (a quarter of the batch loop
on this machine, issue 35) tokenizing that same text once per prompt.

How, and why the ids are the tokenizer's own: a Hugging Face fast tokenizer (``tokenizers``)
first cuts the text at its added tokens (``<image>``, ``<s>``, ...), then normalizes,
pre-tokenizes and encodes each piece between them on its own, and at last adds its special
tokens around the whole (the post-processor). So a batch is cut the same way, each distinct
piece is encoded once (one ``encode_batch_fast`` call: the ids without the character offsets
nobody reads), the pieces' ids are joined with the added tokens' ids, and the special tokens
the post-processor puts before and after a single sequence are added. This is used only where
the library is known to work that way, read from each component's own serialized settings:
a normalizer that acts on a piece's characters alone (Unicode forms, ``Lowercase``, ``Strip``,
``StripAccents``, ``Prepend``, ``Replace``: Llama's "legacy" ``Prepend("▁")`` is applied to every
piece by the library too), a pre-tokenizer that splits each piece apart (``ByteLevel`` without a
prefix space, ``Split`` with a regex such as Qwen2's or Llama 3's, ``Digits``, ``Punctuation``,
``Whitespace``, ``WhitespaceSplit``, ``Metaspace`` whose prepend scheme is ``never`` or
``always``; ``first`` treats the text's first piece apart), or a ``Sequence`` of those; added
tokens matched as written (no stripping, not single-word; a "normalized" one only without a
normalizer: the library cuts at those in a second pass, in each piece, as done here), special tokens not
split, no truncation or padding, and a post-processor that only adds fixed tokens around one
sequence; a BPE model without dropout (random merges: no two calls agree); a tokenizer class
that overrides no step of transformers' call (which could change the text first). A set of probe texts
(added tokens at the start, the end, side by side, between spaces and newlines, digits,
punctuation, accents) must come out equal to the tokenizer's own call when it is set up: the last
guard, over the allow-list.
Anything else is tokenized by the tokenizer's own call on the whole batch, as before.
Each batch first compares what the admission read (added tokens and their options, the three
components, ``split_special_tokens``, dropout) with the tokenizer as it is now, and checks it
again if it changed: it is made once per interface, and the tokenizer may change after.
"""
from __future__ import annotations

import json
import logging
import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

logger = logging.getLogger(__name__)

#: normalizers that act on a piece's characters alone (the library normalizes each piece apart)
_NORMALIZERS = {"NFC", "NFD", "NFKC", "NFKD", "Lowercase", "Strip", "StripAccents", "Prepend", "Replace"}
#: pre-tokenizers that split each piece on its own (Metaspace and ByteLevel: settings checked below)
_PRE_TOKENIZERS = {"ByteLevel", "Split", "Digits", "Punctuation", "Whitespace", "WhitespaceSplit", "Metaspace"}
#: post-processors that add fixed tokens around one sequence (ByteLevel: offsets only)
_POST_PROCESSORS = {"TemplateProcessing", "ByteLevel", "RobertaProcessing", "BertProcessing"}
#: the steps of a transformers tokenizer's own call from texts to ids, and the modules that define
#: them as a call of the backend on the texts as given: a class that overrides one may change them
_CALL_STEPS = ("__call__", "_call_one", "encode_plus", "batch_encode_plus", "_encode_plus", "_batch_encode_plus",
               "prepare_for_tokenization")
_CALL_MODULES = {"transformers.tokenization_utils_base", "transformers.tokenization_utils_tokenizers",
                 "transformers.tokenization_utils_fast", "transformers.tokenization_utils"}
#: texts whose ids must be the tokenizer's own before the pieces are trusted ({t}: an added token)
_PROBES = ("{t}", "a{t}b", " {t} ", "{t}{t}\n{t}", "x {t}\n\ny  {t}", "héllo, wörld!{t} 12 34\t.", "  a  \n ",
           "{t}a", "{t} a", "a {t}", "a  {t}  b", "{t}\n", "\n{t}\n\n", "Ab 123456 7{t}89 x1y2",
           "it's ok...!?{t}?! (A) b; c.", " \t {t}\t", "e\u0301 ÉCOLE ﬁ ① ▁a ▁{t}▁", "漢字{t}😀 ", "{t}  ", "   ")


def _component(part: Any) -> Optional[Dict[str, Any]]:
    """A tokenizers component's own settings (its serialized JSON: type, nested parts), or None."""
    return None if part is None else json.loads(part.__getstate__())


def _unknown(spec: Optional[Dict[str, Any]], allowed: set, nested: str) -> Optional[str]:
    """The first component of ``spec`` (a ``Sequence``'s ``nested`` list walked) not known to act
    on each piece apart, described; None if all are."""
    if spec is None:
        return None
    kind = spec.get("type")
    if kind == "Sequence":
        return next((u for u in (_unknown(s, allowed, nested) for s in spec.get(nested, [])) if u), None)
    if kind not in allowed:
        return str(kind)
    if kind == "ByteLevel" and nested == "pretokenizers" and spec.get("add_prefix_space", True):
        return "ByteLevel with a prefix space"
    if kind == "Metaspace" and spec.get("prepend_scheme") not in ("never", "always"):
        return f"Metaspace with prepend_scheme {spec.get('prepend_scheme')!r}"  # "first": the text's start
    return None


class BatchTokenizer:
    """``ids(texts)``: each text's token ids, as ``tokenizer(texts, add_special_tokens=True)``
    gives them, the distinct pieces of the batch tokenized once (module docstring)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.backend: Any = None
        self._cut: List["re.Pattern[str]"] = []  # the library's passes: tokens as written, then normalized ones
        self._added: Dict[str, int] = {}
        self._around: Tuple[List[int], List[int]] = ([], [])
        self._seen: Any = None
        self._admit()

    def _admit(self) -> None:
        """Set up (or again, after the tokenizer changed) and note the state it was checked in."""
        self.backend, self._cut, self._added, self._around = None, [], {}, ([], [])
        reason = self._set_up()
        if reason:
            self.backend = None
            logger.debug("token ids of each prompt from the tokenizer's own call: %s", reason)
        self._seen = self._state()

    def _state(self) -> Any:
        """What the admission read, as it stands now: a tokenizer changed after it was made (added
        tokens, ``split_special_tokens``, ``add_bos_token`` rewriting the post-processor, a BPE
        dropout set) must be checked again, not cut with the old tokens and fixed tokens."""
        tok = self.tokenizer
        bk = getattr(tok, "backend_tokenizer", None) or getattr(tok, "_tokenizer", None)
        if bk is None or not hasattr(bk, "get_added_tokens_decoder"):
            return None
        try:
            parts: Any = tuple(None if getattr(bk, n, None) is None else getattr(bk, n).__getstate__()
                               for n in ("normalizer", "pre_tokenizer", "post_processor"))
        except Exception:  # a custom component (the admission refused it)
            parts = "unreadable"
        added = bk.get_added_tokens_decoder()  # (AddedToken's == compares the content and every option)
        return (id(bk), bool(getattr(tok, "split_special_tokens", False)),
                bool(getattr(bk, "encode_special_tokens", False)), parts, added, getattr(getattr(bk, "model", None), "dropout", None))

    @property
    def by_pieces(self) -> bool:
        """Whether batches are tokenized piece by piece (else by the tokenizer's own call)."""
        return self.backend is not None

    def _set_up(self) -> Optional[str]:
        """Check the tokenizer works as the module docstring says; the reason it does not, or None."""
        tok = self.tokenizer
        bk = getattr(tok, "backend_tokenizer", None) or getattr(tok, "_tokenizer", None)
        if bk is None or not hasattr(bk, "encode_batch_fast") or not hasattr(bk, "get_added_tokens_decoder"):
            return "not a fast tokenizer"
        own = next((n for n in _CALL_STEPS
                    if getattr(getattr(type(tok), n, None), "__module__", None) not in _CALL_MODULES | {None}), None)
        if own:
            return f"{type(tok).__name__} has its own {own}"  # (CodeLlama's infilling, LayoutLM's boxes...)
        if getattr(bk, "encode_special_tokens", False) or getattr(tok, "split_special_tokens", False):
            return "special tokens are split"
        if getattr(getattr(bk, "model", None), "dropout", None):
            return "its BPE model drops merges at random (dropout)"  # no two calls alike
        try:
            parts = {name: _component(getattr(bk, name)) for name in ("normalizer", "pre_tokenizer", "post_processor")}
        except Exception as exc:  # a custom (Python) component: "cannot be serialized"
            return f"its pipeline cannot be read ({exc})"
        for name, allowed, nested in (("normalizer", _NORMALIZERS, "normalizers"),
                                      ("pre_tokenizer", _PRE_TOKENIZERS, "pretokenizers"),
                                      ("post_processor", _POST_PROCESSORS, "processors")):
            unknown = _unknown(parts[name], allowed, nested)
            if unknown:
                return f"{name} {unknown}"
        passes: Tuple[List[str], List[str]] = ([], [])
        for tid, t in bk.get_added_tokens_decoder().items():
            if t.lstrip or t.rstrip or t.single_word or (t.normalized and parts["normalizer"] is not None):
                return f"added token {t.content!r} is matched with options"
            self._added[t.content] = int(tid)
            passes[bool(t.normalized)].append(t.content)
        if not self._added:
            return "no added tokens"
        # leftmost-longest, as the library matches them
        self._cut = [re.compile("(" + "|".join(re.escape(t) for t in sorted(p, key=len, reverse=True)) + ")")
                     for p in passes if p]
        self.backend = bk
        if bk.truncation is not None or bk.padding is not None:
            return "the backend truncates or pads"
        a = bk.encode("a", add_special_tokens=False).ids
        full = bk.encode("a", add_special_tokens=True).ids
        k = next((i for i in range(len(full) - len(a) + 1) if full[i:i + len(a)] == a), None)
        if not a or k is None:
            return "the special tokens are not around the sequence"
        self._around = (full[:k], full[k + len(a):])
        # every probe around the first tokens of each pass (a model may add a thousand alike), and all in one text
        probes = [p.format(t=t) for pass_ in passes for t in pass_[:8] for p in _PROBES]
        every = list(self._added)
        probes += ["a " + " b".join(every[i:i + 64]) + " c" for i in range(0, len(every), 64)]
        if self._by_pieces(probes) != [list(x) for x in tok(probes, add_special_tokens=True)["input_ids"]]:
            return "the probe texts tokenize differently piece by piece"
        return None

    def ids(self, texts: Sequence[str]) -> List[List[int]]:
        """Each text's token ids with the tokenizer's special tokens (BOS), no padding."""
        if not texts:
            return []
        if self._state() != self._seen:
            self._admit()
        bk = self.backend
        if bk is None or bk.truncation is not None or bk.padding is not None:
            return [list(x) for x in self.tokenizer(list(texts), add_special_tokens=True)["input_ids"]]
        return self._by_pieces(texts)

    def _by_pieces(self, texts: Sequence[str]) -> List[List[int]]:
        cuts = [[t] for t in texts]  # text, added token, text, ... (texts may be "")
        for cut in self._cut:
            cuts = [[x for j, part in enumerate(parts) for x in (cut.split(part) if j % 2 == 0 else (part,))]
                    for parts in cuts]
        distinct: Dict[str, int] = {}
        for parts in cuts:
            for piece in parts[::2]:
                if piece and piece not in distinct:
                    distinct[piece] = len(distinct)
        encoded = [e.ids for e in self.backend.encode_batch_fast(list(distinct), add_special_tokens=False)]
        before, after = self._around
        out: List[List[int]] = []
        for parts in cuts:
            ids = list(before)
            for j, piece in enumerate(parts):
                if j % 2:
                    ids.append(self._added[piece])
                elif piece:
                    ids.extend(encoded[distinct[piece]])
            ids.extend(after)
            out.append(ids)
        return out
