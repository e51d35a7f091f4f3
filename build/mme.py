"""MME builder: 14 yes/no subtasks, two questions per image, read from the official release
folder or from the Hugging Face parquet layout.

Why one module does both layouts: both must yield the very same samples (ids, order,
questions, answers), so they share one normalisation path (``_items_from_questions``) and
differ only in how questions and images are found.

Config keys (configs/datasets/mme.yaml documents them):
  root            official release folder (one folder per subtask)
  parquet         parquet file, folder or glob (or a list of them), the HF layout
  subtasks        subset of subtask names (default: all 14)
  prompt          "official" (keep " Please answer yes or no.") or "lmms_eval"
  check_counts    "auto" (assert official counts when all 14 subtasks are loaded), true, false
  verify_images   check every image decodes at build time (default true)
  skip_corrupt    skip (and count) images that do not decode instead of failing
  image_cache_dir where parquet images are written as files
                  (default: $REFORM_CACHE/mme_images/<hash>, else under the temp dir)
"""
from __future__ import annotations

import glob
import hashlib
import logging
import os
import re
from collections import OrderedDict
from typing import Any, ClassVar, Dict, Iterable, List, Optional, Sequence, Tuple

from .. import configs
from .registry import FLAG, PATH, Builder, is_paths, one_of, register_builder
from ..utils.errors import ReformError, input_error, missing_path
from ..utils.images import check_image
from ..utils.inputs import list_dir, read_bytes, read_text
from ..utils.paths import cache_root

logger = logging.getLogger(__name__)

if __name__ == "__main__":  # the command has its own module (running this one makes Python warn)
    raise SystemExit("use: python -m reform_eval.build.mme_placeholder --questions DIR --out DIR [--parquet FILE]")

PERCEPTION = ("existence", "count", "position", "color", "posters", "celebrity", "scene",
              "landmark", "artwork", "OCR")
COGNITION = ("commonsense_reasoning", "numerical_calculation", "text_translation", "code_reasoning")
SUBTASKS = PERCEPTION + COGNITION

#: official number of questions per subtask (two per image)
OFFICIAL_COUNTS: Dict[str, int] = {
    "existence": 60, "count": 60, "position": 60, "color": 60, "posters": 294, "celebrity": 340,
    "scene": 400, "landmark": 400, "artwork": 400, "OCR": 40,
    "commonsense_reasoning": 140, "numerical_calculation": 40, "text_translation": 40,
    "code_reasoning": 40,
}
OFFICIAL_TOTAL = sum(OFFICIAL_COUNTS.values())  # 2374

#: subtasks whose release folder holds images/ and questions_answers_YN/
NESTED_SUBTASKS = ("artwork", "celebrity", "landmark", "posters", "scene")
IMAGE_EXTS = (".jpg", ".png", ".jpeg", ".JPG", ".PNG", ".JPEG")

OFFICIAL_SUFFIX = " Please answer yes or no."
LMMS_EVAL_SUFFIX = "\nAnswer the question using a single word or phrase."
PROMPTS = ("official", "lmms_eval")


def category_of(subtask: str) -> str:
    """"perception" or "cognition" for a subtask name."""
    if subtask in PERCEPTION:
        return "perception"
    if subtask in COGNITION:
        return "cognition"
    raise ReformError(f"unknown MME subtask '{subtask}'; valid names: {', '.join(SUBTASKS)}")


def canonical_subtask(name: str) -> Optional[str]:
    """The official spelling of a subtask name (case-insensitive), or None."""
    lowered = {s.lower(): s for s in SUBTASKS}
    return lowered.get(str(name).strip().lower())


def normalize_gt(value: Any) -> Optional[str]:
    """"Yes"/"No" from any casing (the official tool lower-cases ground truth), else None."""
    v = str(value).strip().lower()
    return {"yes": "Yes", "no": "No"}.get(v)


def strip_official_suffix(question: str) -> str:
    """The bare question, without the trailing " Please answer yes or no."."""
    if question.endswith(OFFICIAL_SUFFIX):
        return question[: -len(OFFICIAL_SUFFIX)]
    return question.rstrip()


def apply_prompt(question: str, prompt: str) -> str:
    """The question as shown for a prompt variant (official text, or lmms-eval's suffix)."""
    if prompt == "official":
        return question
    if prompt == "lmms_eval":
        return strip_official_suffix(question.strip()) + LMMS_EVAL_SUFFIX
    raise ReformError(f"unknown MME prompt '{prompt}'; valid names: {', '.join(PROMPTS)}")


def image_ok(source: Any) -> Optional[str]:
    """None if the image (path or bytes) passes the pixel guard and ``verify``, else the reason."""
    try:
        check_image(source)
        return None
    except ReformError as e:
        return str(e).split(": ", 1)[-1]


# -- reading question files ------------------------------------------------------------

def parse_question_lines(lines: Iterable[str], file: str) -> List[Tuple[int, str, str]]:
    """``question<TAB>Yes|No`` lines -> [(line number, question, "Yes"|"No")]; blank lines skipped."""
    out = []
    for no, raw in enumerate(lines, 1):
        line = raw.rstrip("\r\n")
        if not line.strip():
            continue
        if "\t" not in line:
            raise input_error("expected 'question<TAB>Yes|No'", file=file, record=f"line {no}")
        question, answer = line.rsplit("\t", 1)
        gt = normalize_gt(answer)
        if gt is None:
            raise input_error(f"answer must be Yes or No, got {answer!r}", file=file,
                              record=f"line {no}", field="answer")
        out.append((no, question, gt))
    return out


def check_pair(rows: Sequence[Tuple[int, str, str]], file: str, what: str = "image") -> None:
    """Each image has exactly two questions, one answered Yes and one No."""
    if len(rows) != 2:
        line = rows[-1][0] if rows else 1
        raise input_error(f"{what} has {len(rows)} question(s); MME has exactly 2 per image "
                          "(one Yes, one No)", file=file, record=f"line {line}")
    if sorted(r[2] for r in rows) != ["No", "Yes"]:
        raise input_error(f"{what}'s two questions must be answered one Yes and one No, got "
                          f"{rows[0][2]}/{rows[1][2]}", file=file, record=f"line {rows[1][0]}")


def _read_lines(path: str) -> List[str]:
    return read_text(path, "question file").splitlines(keepends=True)


def scan_release_subtask(root: str, subtask: str) -> List[Dict[str, Any]]:
    """One subtask folder of the official release -> [{name, image_path, rows, file}]."""
    # the release spells OCR in capitals: any casing of the folder name, but only one (list_dir
    # refuses case twins, dangling links and names that are not UTF-8)
    matches = [d for d in list_dir(root, "MME release folder", kind="dir") if d.lower() == subtask.lower()]
    if not matches:
        raise input_error(f"subtask folder '{subtask}' not found", file=root)
    folder = os.path.join(root, matches[0])
    if subtask in NESTED_SUBTASKS and os.path.isdir(os.path.join(folder, "questions_answers_YN")):
        qdir, idir = os.path.join(folder, "questions_answers_YN"), os.path.join(folder, "images")
    else:
        qdir = idir = folder
    entries = []
    txts = list_dir(qdir, "MME question folder", suffix=(".txt",), kind="file")
    if not txts:
        raise input_error("no question files (<stem>.txt)", file=qdir)
    for txt in txts:
        stem = txt[:-4]
        path = os.path.join(qdir, txt)
        image = next((os.path.join(idir, stem + e) for e in IMAGE_EXTS
                      if os.path.isfile(os.path.join(idir, stem + e))), None)
        if image is None:
            raise input_error(f"no image {stem}.jpg/.png for this question file in {idir}", file=path)
        rows = parse_question_lines(_read_lines(path), path)
        check_pair(rows, path)
        entries.append({"name": os.path.basename(image), "image": image, "rows": rows, "file": path})
    return entries


def _parquet_files(spec: Any, resolve) -> List[str]:
    specs = spec if isinstance(spec, (list, tuple)) else [spec]
    files: List[str] = []
    for s in specs:
        p = resolve(s)
        if os.path.isdir(p):
            found = sorted(glob.glob(os.path.join(p, "**", "*.parquet"), recursive=True))
        elif any(ch in p for ch in "*?["):
            found = sorted(glob.glob(p, recursive=True))
        else:
            found = [p] if os.path.isfile(p) else []
        if not found:
            raise input_error("no parquet files found", file=p)
        files.extend(found)
    return files


def read_parquet_rows(files: List[str]) -> Iterable[Tuple[str, int, Dict[str, Any]]]:
    """(file, row number in it, row) of the HF parquet layout, image bytes undecoded
    (question_id, image, question, answer, category); memory-mapped, so the real set
    (~1 GB of images) is not held in RAM. Files are read one by one so each row knows its file."""
    import datasets
    needed = ("question_id", "image", "question", "answer")
    for file in files:
        ds = datasets.Dataset.from_parquet(file)
        missing = [c for c in needed if c not in ds.column_names]
        if missing:
            raise input_error(f"parquet lacks column(s) {', '.join(missing)} (has {', '.join(ds.column_names)})",
                              file=file)
        if isinstance(ds.features.get("image"), datasets.Image):
            ds = ds.cast_column("image", datasets.Image(decode=False))
        for i, row in enumerate(ds):
            yield file, i, row


def parquet_image_path(cache: str, subtask: str, question_id: str, file: str, data: bytes) -> str:
    """Where one parquet image is cached: unique per question id, parquet file and content.

    Why: ``count/a/x.png`` and ``count/b/x.png`` (or one id in two parquet files) must never
    share a cached file; the file name is kept last for readability.
    """
    h = hashlib.sha256(f"{os.path.abspath(file)}\0{question_id}\0".encode())
    h.update(data)
    return os.path.join(cache, subtask, h.hexdigest()[:20], os.path.basename(question_id))


def _image_bytes(value: Any, file: str, row: int) -> bytes:
    if isinstance(value, dict):
        if value.get("bytes") is not None:
            return bytes(value["bytes"])
        if value.get("path") and os.path.isfile(value["path"]):
            return read_bytes(value["path"], "parquet image")
    elif isinstance(value, (bytes, bytearray)):
        return bytes(value)
    raise input_error("image holds neither bytes nor a readable path", file=file, record=f"row {row}",
                      field="image")


#: the folder name of the synthetic yes/no set (configs/datasets/mme_synthetic.yaml reads it;
#: ``python -m reform_eval.build.mme_synthetic --out`` writes it): a missing one gets that command
SYNTHETIC_FOLDER = "mme_synthetic"


@register_builder("MME")
class MMEBuilder(Builder):
    """MME (Fu et al. 2023): perception and cognition yes/no questions, scored per image pair."""

    #: Generation first: the official protocol is the default formulation
    formulations = ("Generation", "SingleChoice")
    default_metric = {"Generation": "mme", "SingleChoice": "mme"}
    #: every config key this builder reads
    option_names: ClassVar[Tuple[str, ...]] = ("root", "parquet", "subtasks", "prompt", "check_counts",
                                               "verify_images", "skip_corrupt", "image_cache_dir")
    option_specs = {"root": PATH, "parquet": (is_paths, "a path or a list of paths"),
                    "subtasks": (lambda v: isinstance(v, str) or (isinstance(v, list) and bool(v)
                                                                  and all(isinstance(x, str) for x in v)),
                                 "a subtask or group name, or a list of subtask names"),
                    "prompt": one_of("official", "lmms_eval"), "check_counts": one_of("auto", True, False),
                    "verify_images": FLAG, "skip_corrupt": FLAG, "image_cache_dir": PATH}

    def group_key(self, sample: Dict[str, Any]) -> str:
        """An image with its two questions is one unit (acc+ needs both; subsets keep pairs)."""
        return "/".join(str(p) for p in sample["meta"]["image_key"])

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: counts surfaced to results by run_eval (why: "how many were skipped" must be visible)
        self.build_info: Dict[str, Any] = {"skipped_corrupt_images": 0, "skipped_corrupt": []}

    # -- options --------------------------------------------------------------------------
    def _bool(self, key: str, default: bool) -> bool:
        v = self.config.get(key, default)
        if isinstance(v, str):
            return v.strip().lower() in ("1", "true", "yes", "on")
        return bool(v)

    def subtasks(self) -> List[str]:
        """The selected subtasks in canonical order."""
        sel = self.config.get("subtasks")
        if sel in (None, "", "all"):
            return list(SUBTASKS)
        if isinstance(sel, str):
            sel = [s for s in re.split(r"[,\s]+", sel) if s]
        chosen: List[str] = []
        for s in sel:
            c = canonical_subtask(s)
            if c is None:
                if str(s).lower() in ("perception", "cognition"):
                    chosen.extend(PERCEPTION if str(s).lower() == "perception" else COGNITION)
                    continue
                raise input_error(f"unknown MME subtask '{s}'; valid names: {', '.join(SUBTASKS)}",
                                  file=self.config_path or "<options>", field="subtasks")
            chosen.append(c)
        return [s for s in SUBTASKS if s in chosen]

    # -- sources --------------------------------------------------------------------------
    def check_inputs(self) -> None:
        if self.config.get("parquet"):
            _parquet_files(self.config["parquet"], self.resolve_path)
        elif self.config.get("root") is not None:
            self._release_root()

    def _release_root(self) -> str:
        """The release folder; missing, the one hint for it, whatever the door (run_eval, the
        library, commands/*.sh): the synthetic set's writer for its folder, else the ways to MME."""
        root = self.resolve_path(self.require("root"))
        if os.path.isdir(root):
            return root
        if os.path.basename(os.path.normpath(root)) == SYNTHETIC_FOLDER:
            out = os.path.relpath(root) if not os.path.relpath(root).startswith("..") else root
            raise missing_path(root, "synthetic MME-style set", field="root",
                               hint=f"write it with: python -m reform_eval.build.mme_synthetic --out {out}")
        raise missing_path(root, "MME release folder", field="root",
                           hint="set it with --dataset_option root=/path/to/MME_Benchmark_release_version (or "
                                "`root:` in the dataset config), use the HF layout with --dataset_option "
                                "parquet=/path/to/MME/data, or try the pipeline on placeholder images with "
                                "bash commands/mme_llava.sh")

    def _entries_from_release(self, root: str, subtasks: List[str]) -> Dict[str, List[Dict[str, Any]]]:
        return {s: scan_release_subtask(root, s) for s in subtasks}

    def _cache_dir(self, files: List[str]) -> str:
        if self.config.get("image_cache_dir"):
            return self.resolve_path(self.config["image_cache_dir"])
        h = hashlib.sha256()
        for f in files:
            st = os.stat(f)
            h.update(f"{os.path.abspath(f)}|{st.st_size}|{st.st_mtime_ns}".encode())
        return os.path.join(cache_root(), "mme_images", h.hexdigest()[:16])

    def _entries_from_parquet(self, spec: Any, subtasks: List[str]) -> Dict[str, List[Dict[str, Any]]]:
        files = _parquet_files(spec, self.resolve_path)
        cache = self._cache_dir(files)
        groups: Dict[Tuple[str, str], Dict[str, Any]] = OrderedDict()
        for where, i, row in read_parquet_rows(files):
            qid = str(row["question_id"])
            if "/" not in qid:
                raise input_error(f"question_id must be '<subtask>/<file>', got {qid!r}", file=where,
                                  record=f"row {i}", field="question_id")
            sub_raw, name = qid.split("/", 1)
            sub = canonical_subtask(row.get("category") or sub_raw) or canonical_subtask(sub_raw)
            if sub is None:
                raise input_error(f"unknown subtask in {qid!r}", file=where, record=f"row {i}", field="question_id")
            if sub not in subtasks:
                continue
            gt = normalize_gt(row["answer"])
            if gt is None:
                raise input_error(f"answer must be Yes or No, got {row['answer']!r}", file=where,
                                  record=f"row {i}", field="answer")
            g = groups.get((sub, name))
            if g is None:  # keep one copy of the image bytes per image, not per question
                g = groups[(sub, name)] = {"name": name, "rows": [], "image_value": row["image"],
                                           "file": where, "first_row": i, "qid": qid}
            g["rows"].append((i, str(row["question"]), gt))
        out: Dict[str, List[Dict[str, Any]]] = {s: [] for s in subtasks}
        os.makedirs(cache, exist_ok=True)
        for (sub, name), g in groups.items():
            where = g["file"]
            check_pair(g["rows"], where, what=f"image {sub}/{name}")
            data = _image_bytes(g["image_value"], where, g["first_row"])
            path = parquet_image_path(cache, sub, g["qid"], where, data)
            if not os.path.isfile(path) or os.path.getsize(path) != len(data):
                os.makedirs(os.path.dirname(path), exist_ok=True)
                tmp = f"{path}.{os.getpid()}.tmp"
                with open(tmp, "wb") as f:
                    f.write(data)
                os.replace(tmp, path)  # atomic: ranks building at once never see half a file
            out[sub].append({"name": name, "image": path, "rows": g["rows"], "file": where})
        for sub in out:
            out[sub].sort(key=lambda e: e["name"])
        return out

    # -- main -----------------------------------------------------------------------------
    def load_entries(self) -> Dict[str, List[Dict[str, Any]]]:
        """Per subtask, the images with their two questions (corrupt images handled)."""
        subtasks = self.subtasks()
        if self.config.get("parquet"):
            entries = self._entries_from_parquet(self.config["parquet"], subtasks)
        else:
            entries = self._entries_from_release(self._release_root(), subtasks)
        if self._bool("verify_images", True):
            skip = self._bool("skip_corrupt", False)
            for sub in subtasks:
                kept = []
                for e in entries[sub]:
                    why = image_ok(e["image"])
                    if why is None:
                        kept.append(e)
                        continue
                    if not skip:
                        raise input_error(f"image cannot be decoded ({why}); pass --skip_corrupt to skip it",
                                          file=e["image"])
                    self.build_info["skipped_corrupt_images"] += 1
                    self.build_info["skipped_corrupt"].append(f"{sub}/{e['name']}")
                    self.build_log.append(f"skipped corrupt image {sub}/{e['name']} ({e['image']}): {why}")
                    logger.warning("MME: skipped corrupt image %s (%s)", e["image"], why)
                entries[sub] = kept
        self._check_counts(entries, subtasks)
        return entries

    def _check_counts(self, entries: Dict[str, List[Dict[str, Any]]], subtasks: List[str]) -> None:
        mode = str(self.config.get("check_counts", "auto")).lower()
        if mode in ("false", "0", "no", "off"):
            return
        if mode == "auto" and len(subtasks) != len(SUBTASKS):
            return
        skipped = {s.split("/", 1)[0] for s in self.build_info["skipped_corrupt"]}
        wrong = []
        for s in subtasks:
            n = sum(len(e["rows"]) for e in entries[s])
            if n != OFFICIAL_COUNTS[s] and s not in skipped:
                wrong.append(f"{s} has {n} questions, expected {OFFICIAL_COUNTS[s]}")
        if wrong:
            raise input_error("incomplete MME data: " + "; ".join(wrong) + " (set check_counts: false to allow)",
                              file=self.config.get("root") or self.config.get("parquet") or self.config_path)

    def build_items(self, formulation: str, inference_method: str, seed: int) -> List[Dict[str, Any]]:
        prompt = str(self.config.get("prompt", "official"))
        if prompt not in PROMPTS:
            raise input_error(f"unknown MME prompt '{prompt}'; valid names: {', '.join(PROMPTS)}",
                              file=self.config_path or "<options>", field="prompt")
        entries = self.load_entries()
        items: List[Dict[str, Any]] = []
        for sub in self.subtasks():
            for e in entries[sub]:
                for k, (_line, question, gt) in enumerate(e["rows"]):
                    meta = {"subtask": sub, "category": category_of(sub), "image": e["name"],
                            "image_key": [sub, e["name"]], "question_index": k,
                            "official_question": question, "gt": gt,
                            # where the row came from, without the folder the data lies in (a
                            # sample is its content: the same set elsewhere is the same run)
                            "source_file": "/".join(str(e["file"]).replace(os.sep, "/").split("/")[-2:])}
                    item: Dict[str, Any] = {"sample_id": f"{sub}/{e['name']}/{k}", "images": [e["image"]],
                                            "meta": meta}
                    if formulation == "SingleChoice":
                        # options replace the yes/no request; the generic pool asks for the mark
                        item["question"] = strip_official_suffix(question)
                        item["answer_options"] = ["Yes", "No"]
                        item["answer"] = 0 if gt == "Yes" else 1
                    else:
                        item["question"] = apply_prompt(question, prompt)
                        item["instruct"] = ""
                        item["answer"] = gt
                        item["candidates"] = ["Yes", "No"]
                        item["answer_index"] = 0 if gt == "Yes" else 1
                    items.append(item)
        self.build_log.append(f"{len(items)} questions from {len(self.subtasks())} subtask(s), prompt={prompt}")
        return items

    def in_context_example(self, formulation: str) -> Optional[Dict[str, Any]]:
        """A text-only yes/no exchange (the official protocol is zero-shot: pass in_context_sample False)."""
        if formulation == "SingleChoice":
            return {"question": "Is the sky blue on a clear day?", "answer_options": ["Yes", "No"], "answer": 0}
        return {"question": "Is the sky blue on a clear day?" + OFFICIAL_SUFFIX, "answer": "Yes"}


# -- placeholder release (tests, demos) --------------------------------------------------

def shipped_questions() -> str:
    """The official question lists shipped with the project (``configs/data/mme_questions``,
    installed as package data): what placeholder releases, benches and tests are built from."""
    return os.path.join(os.path.dirname(os.path.abspath(configs.__file__)), "data", "mme_questions")


def read_question_lists(questions_dir: str) -> Dict[str, List[Tuple[int, str, str, str]]]:
    """The official question lists (``<subtask>.txt``: image<TAB>question<TAB>Yes|No) -> rows."""
    out: Dict[str, List[Tuple[int, str, str, str]]] = {}
    for sub in SUBTASKS:
        path = os.path.join(questions_dir, f"{sub}.txt")
        if not os.path.isfile(path):
            continue
        rows = []
        for no, raw in enumerate(_read_lines(path), 1):
            line = raw.rstrip("\r\n")
            if not line.strip():
                continue
            parts = line.split("\t")
            if len(parts) < 3:
                raise input_error("expected image<TAB>question<TAB>Yes|No", file=path, record=f"line {no}")
            gt = normalize_gt(parts[2])
            if gt is None:
                raise input_error(f"answer must be Yes or No, got {parts[2]!r}", file=path, record=f"line {no}")
            rows.append((no, parts[0], parts[1], gt))
        out[sub] = rows
    return out


def write_placeholder_release(questions_dir: str, out_dir: str, subtasks: Optional[Sequence[str]] = None,
                              size: int = 8) -> str:
    """Lay out an official-release-shaped folder from the question lists, with tiny placeholder
    images (why: the real images cannot be shipped; tests and smoke runs need the layout)."""
    from PIL import Image
    lists = read_question_lists(questions_dir)
    if not lists:
        raise input_error("no <subtask>.txt question lists", file=questions_dir)
    for sub, rows in lists.items():
        if subtasks is not None and sub not in subtasks:
            continue
        by_image: Dict[str, List[Tuple[str, str]]] = OrderedDict()
        for _no, name, q, gt in rows:
            by_image.setdefault(name, []).append((q, gt))
        nested = sub in NESTED_SUBTASKS
        qdir = os.path.join(out_dir, sub, "questions_answers_YN") if nested else os.path.join(out_dir, sub)
        idir = os.path.join(out_dir, sub, "images") if nested else qdir
        os.makedirs(qdir, exist_ok=True)
        os.makedirs(idir, exist_ok=True)
        for i, (name, qs) in enumerate(by_image.items()):
            stem, ext = os.path.splitext(name)
            colour = (i * 37 % 256, i * 91 % 256, i * 53 % 256)
            Image.new("RGB", (size, size), colour).save(os.path.join(idir, name),
                                                        format="PNG" if ext.lower() == ".png" else "JPEG")
            with open(os.path.join(qdir, stem + ".txt"), "w", encoding="utf-8") as f:
                f.write("".join(f"{q}\t{gt}\n" for q, gt in qs))
    return out_dir


def write_placeholder_parquet(release_dir: str, out_file: str, subtasks: Optional[Sequence[str]] = None) -> str:
    """The HF parquet layout (question_id, image, question, answer, category) from a release folder."""
    import datasets
    cols: Dict[str, List[Any]] = {"question_id": [], "image": [], "question": [], "answer": [], "category": []}
    for sub in SUBTASKS:
        if subtasks is not None and sub not in subtasks:
            continue
        if not os.path.isdir(os.path.join(release_dir, sub)):
            continue
        for e in scan_release_subtask(release_dir, sub):
            with open(e["image"], "rb") as f:
                data = f.read()
            for _no, q, gt in e["rows"]:
                cols["question_id"].append(f"{sub}/{e['name']}")
                cols["image"].append({"bytes": data, "path": e["name"]})
                cols["question"].append(q)
                cols["answer"].append(gt)
                cols["category"].append(sub)
    feats = datasets.Features({"question_id": datasets.Value("string"), "image": datasets.Image(),
                               "question": datasets.Value("string"), "answer": datasets.Value("string"),
                               "category": datasets.Value("string")})
    os.makedirs(os.path.dirname(os.path.abspath(out_file)), exist_ok=True)
    datasets.Dataset.from_dict(cols, features=feats).to_parquet(out_file)
    return out_file
