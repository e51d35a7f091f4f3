"""``--dataset_name custom``: your own items from a JSONL file.

Each line: ``{"sample_id": str, "images": [paths], "question": str, "answer_options": [str],
"answer": int}`` (a choice: the answer is the right option's index), or ``"answer": str``
(optional ``"candidates"``: [str]) for Generation only; optional ``"meta"`` (an object). Image
paths are relative to the JSONL file. A choice line run with ``--formulation Generation`` means
the same: its reference is the right option's text and its options are the closed vocabulary
(``candidates``). An answer that must be text and is not (a number) is refused, never
converted.
Config keys: ``data_file`` (required), ``skip_corrupt`` (skip and count items whose images do
not decode, instead of failing).
"""
from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Tuple

from .registry import FLAG, PATH, Builder, register_builder
from ..utils.answer_text import option_collision
from ..utils.errors import ReformError, input_error, missing_path
from ..utils.inputs import check_name, iter_jsonl
from ..utils.images import open_image


@register_builder("custom")
class CustomBuilder(Builder):
    """Reads user-supplied items; every field is checked with file/line/field errors."""

    option_names = ("data_file", "skip_corrupt")
    option_specs = {"data_file": PATH, "skip_corrupt": FLAG}

    def check_inputs(self) -> None:
        if self.config.get("data_file") is not None:
            self._data_file()

    def _data_file(self) -> str:
        data_file = self.require("data_file")
        if not isinstance(data_file, str):
            raise input_error("must be a path", file=self.config_path or "<options>", field="data_file")
        path = check_name(self.resolve_path(data_file), "data file")
        if not os.path.isfile(path):
            raise missing_path(path, "data file")
        return path

    def build_items(self, formulation: str, inference_method: str, seed: int) -> List[Dict[str, Any]]:
        path = self._data_file()
        base = os.path.dirname(path)
        items = []
        first_line: Dict[str, int] = {}
        for lineno, rec in iter_jsonl(path, "data file"):  # decoding, depth, numbers, Unicode checked there
            item = self._item(rec, formulation, path, lineno, base)
            if item["sample_id"] in first_line:
                raise input_error(f"duplicate sample_id {item['sample_id']!r} (first on line "
                                  f"{first_line[item['sample_id']]}); every item needs its own id", file=path,
                                  record=f"line {lineno}", field="sample_id")
            first_line[item["sample_id"]] = lineno
            items.append(item)
        if self.config.get("skip_corrupt"):
            items = self._skip_corrupt(items)
        return items

    def _skip_corrupt(self, items: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
        """Drop items with an image that does not decode; the count goes to results."""
        kept, skipped = [], []
        for it in items:
            try:
                for im in it["images"]:
                    open_image(im, record=it["sample_id"])
                kept.append(it)
            except ReformError:
                skipped.append(it["sample_id"])
        self.build_info = {"skipped_corrupt_images": len(skipped), "skipped_corrupt": skipped}
        if skipped:
            self.build_log.append(f"skipped {len(skipped)} item(s) with undecodable images: {skipped[:10]}")
        return kept

    @staticmethod
    def _item(rec: Any, formulation: str, path: str, lineno: int, base: str) -> Dict[str, Any]:
        where = f"line {lineno}"
        if not isinstance(rec, dict):
            raise input_error(f"an item must be a JSON object, got {json.dumps(rec)[:40]}", file=path, record=where)
        for key in ("sample_id", "question", "answer"):
            if key not in rec:
                raise input_error("missing", file=path, record=where, field=key)
        if not isinstance(rec["sample_id"], (str, int)) or isinstance(rec["sample_id"], bool) \
                or not str(rec["sample_id"]).strip():
            raise input_error("must be a non-empty string", file=path, record=where, field="sample_id")
        if not isinstance(rec["question"], str):
            raise input_error("must be a string", file=path, record=where, field="question")
        images = rec.get("images", [])
        if not isinstance(images, list) or not all(isinstance(p, str) and p and "\x00" not in p
                                                   for p in images):
            raise input_error("must be a list of image paths (strings)", file=path, record=where, field="images")
        meta = rec.get("meta", {})
        if not isinstance(meta, dict):
            raise input_error("must be an object", file=path, record=where, field="meta")
        item: Dict[str, Any] = {"sample_id": str(rec["sample_id"]), "question": rec["question"],
                "images": [p if os.path.isabs(p) else os.path.join(base, p) for p in images],
                "meta": dict(meta)}
        if "answer_options" in rec:  # a choice line: it means the same under either formulation
            opts, ans = CustomBuilder._options(rec, path, where)
            if formulation == "SingleChoice":
                item["answer_options"], item["answer"] = opts, ans
                return item
            if "candidates" in rec:
                raise input_error("give answer_options (the answer an option index) or candidates (the answer its "
                                  "text), not both", file=path, record=where, field="candidates")
            # Generation: the reference is the right option's text, the options its closed vocabulary
            item["answer"], item["candidates"], item["answer_index"] = opts[ans], opts, ans
            return item
        if formulation == "SingleChoice":
            raise input_error("needs a list of at least 2 option texts", file=path, record=where,
                              field="answer_options")
        if not isinstance(rec["answer"], str):
            raise input_error(f"must be a string (the reference answer's text), got {type(rec['answer']).__name__} "
                              f"{json.dumps(rec['answer'])[:40]}; an option index needs answer_options", file=path,
                              record=where, field="answer")
        item["answer"] = rec["answer"]
        if "candidates" in rec:
            cands = rec["candidates"]
            if not isinstance(cands, list) or not cands or not all(isinstance(c, str) for c in cands):
                raise input_error("must be a non-empty list of strings", file=path, record=where, field="candidates")
            problem = option_collision(cands)
            if problem:
                raise input_error(problem, file=path, record=where, field="candidates")
            item["candidates"] = list(cands)
            if item["answer"] not in item["candidates"]:
                raise input_error(f"the answer {item['answer']!r} is not one of the candidates (the sample could "
                                  "never be scored right)", file=path, record=where, field="candidates")
            item["answer_index"] = item["candidates"].index(item["answer"])
        return item

    @staticmethod
    def _options(rec: Dict[str, Any], path: str, where: str) -> Tuple[List[str], int]:
        """(option texts, the right option's index) of a choice line."""
        opts = rec.get("answer_options")
        if not isinstance(opts, list) or len(opts) < 2 or not all(
                isinstance(o, (str, int, float)) and not isinstance(o, bool) and str(o) not in ("nan", "inf", "-inf")
                for o in opts):
            raise input_error("needs a list of at least 2 option texts", file=path, record=where,
                              field="answer_options")
        if len({str(o) for o in opts}) != len(opts):
            raise input_error("has the same option twice", file=path, record=where, field="answer_options")
        problem = option_collision([str(o) for o in opts])
        if problem:
            raise input_error(problem, file=path, record=where, field="answer_options")
        ans = rec["answer"]
        if not isinstance(ans, int) or isinstance(ans, bool) or not 0 <= ans < len(opts):
            raise input_error(f"must be an option index in 0..{len(opts) - 1}", file=path, record=where,
                              field="answer")
        return [str(o) for o in opts], ans
