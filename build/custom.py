"""``--dataset_name custom``: your own items from a JSONL file.

Each line: ``{"sample_id": str, "images": [paths], "question": str, "answer_options": [str],
"answer": int}`` for SingleChoice, or ``"answer": str`` (optional ``"candidates"``) for
Generation; optional ``"meta"``. Image paths are relative to the JSONL file. Config keys:
``data_file`` (required).
"""
from __future__ import annotations

import json
import os
from typing import Any, Dict, List

from build.registry import Builder, register_builder
from utils.errors import input_error


@register_builder("custom")
class CustomBuilder(Builder):
    """Reads user-supplied items; every field is checked with file/line/field errors."""

    def build_items(self, formulation: str, inference_method: str, seed: int) -> List[Dict[str, Any]]:
        path = self.resolve_path(self.require("data_file"))
        if not os.path.isfile(path):
            raise input_error("data file not found", file=path)
        base = os.path.dirname(path)
        items = []
        with open(path, "r", encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as e:
                    raise input_error(f"malformed JSON ({e.msg})", file=path, record=f"line {lineno}") from None
                items.append(self._item(rec, formulation, path, lineno, base))
        return items

    @staticmethod
    def _item(rec: Dict[str, Any], formulation: str, path: str, lineno: int, base: str) -> Dict[str, Any]:
        where = f"line {lineno}"
        for key in ("sample_id", "question", "answer"):
            if key not in rec:
                raise input_error("missing", file=path, record=where, field=key)
        item = {"sample_id": str(rec["sample_id"]), "question": str(rec["question"]),
                "images": [p if os.path.isabs(p) else os.path.join(base, p) for p in rec.get("images", [])],
                "meta": dict(rec.get("meta", {}))}
        if formulation == "SingleChoice":
            opts = rec.get("answer_options")
            if not isinstance(opts, list) or len(opts) < 2:
                raise input_error("needs a list of at least 2 options", file=path, record=where, field="answer_options")
            ans = rec["answer"]
            if not isinstance(ans, int) or isinstance(ans, bool) or not 0 <= ans < len(opts):
                raise input_error(f"must be an option index in 0..{len(opts) - 1}", file=path, record=where,
                                  field="answer")
            item["answer_options"] = [str(o) for o in opts]
            item["answer"] = ans
        else:
            item["answer"] = str(rec["answer"])
            if "candidates" in rec:
                item["candidates"] = [str(c) for c in rec["candidates"]]
                if item["answer"] in item["candidates"]:
                    item["answer_index"] = item["candidates"].index(item["answer"])
        return item
