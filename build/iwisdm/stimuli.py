"""Stimulus sets for iWISDM: a built-in procedural set and an importer for the original format.

Why two: the paper's ShapeNet renders cannot be downloaded here, so the default set is drawn
deterministically with Pillow (no files needed); users holding the original renders point
``stim_dir`` at them and get the paper's stimuli through the same interface.

Frames are 224x224 black canvases split into four quadrants; an object is resized to one
quadrant (112x112). Rendered stimuli are cached, frames are composed by one paste each.
"""
from __future__ import annotations

import csv
import logging
import math
import os
import pickle
from functools import lru_cache
from typing import Any, Dict, List, Optional, Sequence, Tuple

from PIL import Image, ImageDraw

from ...utils.errors import input_error
from ...utils.inputs import check_name, list_dir, read_bytes, read_csv, read_json
from ...utils.images import open_image

logger = logging.getLogger(__name__)

IMG_SIZE = 224
QUAD = IMG_SIZE // 2
#: location vocabulary (answer words) and the top-left corner of each quadrant
LOCATIONS: Tuple[str, ...] = ("top left", "top right", "bottom left", "bottom right")
LOC_ORIGIN: Dict[str, Tuple[int, int]] = {"top left": (0, 0), "top right": (QUAD, 0),
                                          "bottom left": (0, QUAD), "bottom right": (QUAD, QUAD)}
#: the paper's eight ShapeNet categories; the procedural set draws one shape family per name
DEFAULT_CATEGORIES: Tuple[str, ...] = ("benches", "boats", "cars", "chairs", "couches", "lighting",
                                       "planes", "tables")
#: required metadata columns of the original stimulus directory format
META_COLUMNS = ("ctg_mod", "obj_mod", "ang_mod")


_BLANK: Dict[bool, Image.Image] = {}


class StimulusSet:
    """Interface every stimulus source provides: vocabulary + cached quadrant images."""

    categories: Tuple[str, ...] = ()
    #: number of identities (objects) per category
    n_identities: int = 0
    #: number of view angles per object
    n_views: int = 0
    source: str = ""

    def stimulus(self, category: str, identity: int, view: int) -> Image.Image:
        """The object image resized to one quadrant (RGB, QUAD x QUAD)."""
        raise NotImplementedError

    def codes(self, category: str, identity: int, view: int) -> Tuple[int, int, int]:
        """The original format's integer codes (ctg_mod, obj_mod, ang_mod) of a stimulus."""
        return self.categories.index(category), int(identity), int(view)

    def from_codes(self, ctg: int, obj: int, ang: int) -> Optional[Tuple[str, int, int]]:
        """(category name, identity, view) of the original's integer codes; None if not in this set."""
        if 0 <= ctg < len(self.categories) and 0 <= obj < self.n_identities and 0 <= ang < self.n_views:
            return self.categories[ctg], int(obj), int(ang)
        return None

    def compose(self, objects: Sequence[Dict], fixation: bool = False) -> Image.Image:
        """One frame: a black canvas with each object pasted into its quadrant.

        Delay frames are one shared image per fixation setting (frames are read-only).
        """
        if not objects:
            blank = _BLANK.get(fixation)
            if blank is None:
                blank = _BLANK[fixation] = self._draw_frame((), fixation)
            return blank
        return self._draw_frame(objects, fixation)

    def _draw_frame(self, objects: Sequence[Dict], fixation: bool) -> Image.Image:
        canvas = Image.new("RGB", (IMG_SIZE, IMG_SIZE))
        for obj in objects:
            canvas.paste(self.stimulus(obj["category"], obj["identity"], obj["view"]),
                         LOC_ORIGIN[obj["location"]])
        if fixation:
            draw = ImageDraw.Draw(canvas)
            c = IMG_SIZE // 2
            draw.line((c - 6, c, c + 6, c), fill=(255, 255, 255), width=2)
            draw.line((c, c - 6, c, c + 6), fill=(255, 255, 255), width=2)
        return canvas

    def export(self, root: str, split: str = "train") -> str:
        """Write this set in the original iWISDM directory format and return the split folder.

        Layout: ``root/<split>/<ref>/image.png`` plus ``root/<split>/<split>_metadata.csv`` with
        integer ``ref``, ``ctg_mod``, ``obj_mod``, ``ang_mod`` and the category name ``ctg``.
        The metadata file name carries the split name because the original package (0.1.3)
        pairs a split folder with the metadata file whose name contains that split; the
        importer here (``DirectoryStimuli``) reads it back as well.
        """
        if split not in ("train", "val", "test"):
            raise ValueError(f"split must be train, val or test (the original's split names), got {split!r}")
        split_dir = os.path.join(root, split)
        os.makedirs(split_dir, exist_ok=True)
        rows = []
        ref = 0
        for c, cat in enumerate(self.categories):
            for i in range(self.n_identities):
                for v in range(self.n_views):
                    d = os.path.join(split_dir, str(ref))
                    os.makedirs(d, exist_ok=True)
                    self.stimulus(cat, i, v).save(os.path.join(d, "image.png"))
                    rows.append({"ref": ref, "ctg_mod": c, "obj_mod": i, "ang_mod": v, "ctg": cat})
                    ref += 1
        with open(os.path.join(split_dir, f"{split}_metadata.csv"), "w", newline="", encoding="utf-8") as f:
            w = csv.DictWriter(f, fieldnames=["ref", "ctg_mod", "obj_mod", "ang_mod", "ctg"])
            w.writeheader()
            w.writerows(rows)
        return split_dir


# ---------------------------------------------------------------------------------------------
# Procedural set
# ---------------------------------------------------------------------------------------------
_PALETTE = ((230, 60, 50), (60, 170, 75), (70, 110, 230), (240, 200, 40),
            (200, 80, 210), (40, 200, 210), (245, 140, 40), (235, 235, 235))
_DETAIL = ((20, 20, 20), (255, 255, 255))


def _shape(cat: str, draw: ImageDraw.ImageDraw, body: Tuple[int, int, int], detail: Tuple[int, int, int],
           variant: int) -> None:
    """Draw one category's silhouette on a 112x112 canvas; ``variant`` adds identity detail."""
    if cat == "benches":
        draw.rectangle((12, 60, 100, 70), fill=body)
        for k in range(3):
            draw.rectangle((14, 30 + k * 9, 98, 35 + k * 9), fill=body)
        for x in (18, 90):
            draw.rectangle((x, 70, x + 5, 95), fill=detail)
    elif cat == "boats":
        draw.polygon(((8, 70), (104, 70), (88, 92), (24, 92)), fill=body)
        draw.rectangle((54, 16, 58, 70), fill=detail)
        draw.polygon(((60, 18), (60, 66), (94, 66)), fill=body)
    elif cat == "cars":
        draw.rectangle((8, 55, 104, 80), fill=body)
        draw.polygon(((28, 55), (40, 35), (78, 35), (90, 55)), fill=body)
        draw.rectangle((44, 40, 74, 53), fill=detail)
        for x in (28, 84):
            draw.ellipse((x - 11, 70, x + 11, 92), fill=detail)
    elif cat == "chairs":
        draw.rectangle((30, 58, 82, 66), fill=body)
        draw.rectangle((74, 14, 82, 58), fill=body)
        for x in (30, 76):
            draw.rectangle((x, 66, x + 6, 100), fill=detail)
    elif cat == "couches":
        draw.rounded_rectangle((10, 50, 102, 88), radius=8, fill=body)
        draw.rounded_rectangle((18, 28, 94, 54), radius=6, fill=body)
        for x in (6, 92):
            draw.rounded_rectangle((x, 44, x + 14, 88), radius=5, fill=detail)
    elif cat == "lighting":
        draw.polygon(((36, 18), (76, 18), (90, 48), (22, 48)), fill=body)
        draw.rectangle((53, 48, 59, 92), fill=detail)
        draw.ellipse((34, 88, 78, 100), fill=body)
    elif cat == "planes":
        draw.ellipse((8, 48, 104, 64), fill=body)
        draw.polygon(((48, 54), (70, 54), (52, 16), (44, 16)), fill=body)
        draw.polygon(((48, 58), (70, 58), (52, 96), (44, 96)), fill=body)
        draw.polygon(((8, 56), (20, 56), (12, 36), (6, 36)), fill=detail)
    elif cat == "tables":
        draw.rectangle((8, 38, 104, 48), fill=body)
        for x in (14, 92):
            draw.rectangle((x, 48, x + 7, 96), fill=detail)
    else:  # extra categories of an extended set: a polygon whose sides encode the name
        sides = 3 + (sum(map(ord, cat)) % 6)
        pts = [(56 + 40 * math.cos(2 * math.pi * k / sides), 56 + 40 * math.sin(2 * math.pi * k / sides))
               for k in range(sides)]
        draw.polygon(pts, fill=body)
    if variant == 1:   # identity detail: a marker dot
        draw.ellipse((50, 4, 62, 16), fill=detail)
    elif variant == 2:  # identity detail: a bar at the bottom
        draw.rectangle((30, 104, 82, 108), fill=detail)


class ProceduralStimuli(StimulusSet):
    """Built-in set: 8 categories x 8 identities x 4 views, drawn with Pillow and cached.

    Identities differ in colour (8 palette colours) and a small detail; views are the upright
    object, a 20-degree rotation, a mirror image and a horizontally foreshortened one.
    """

    VIEWS = ("upright", "rotated", "mirrored", "foreshortened")

    def __init__(self, categories: Sequence[str] = DEFAULT_CATEGORIES, n_identities: int = 8) -> None:
        self.categories = tuple(categories)
        check_unique_categories(self.categories, "procedural stimuli")
        self.n_identities = int(n_identities)
        self.n_views = len(self.VIEWS)
        self.source = "procedural"
        self._cache: Dict[Tuple[str, int, int], Image.Image] = {}

    def stimulus(self, category: str, identity: int, view: int) -> Image.Image:
        key = (category, identity, view)
        im = self._cache.get(key)
        if im is None:
            im = self._draw(category, identity, view)
            self._cache[key] = im
        return im

    def _draw(self, category: str, identity: int, view: int) -> Image.Image:
        body = _PALETTE[identity % len(_PALETTE)]
        detail = _DETAIL[0] if sum(body) > 450 else _DETAIL[1]
        im = Image.new("RGB", (QUAD, QUAD))
        _shape(category, ImageDraw.Draw(im), body, detail, (identity // len(_PALETTE) + identity) % 3)
        if view == 1:
            im = im.rotate(20, resample=Image.Resampling.BILINEAR)
        elif view == 2:
            im = im.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        elif view == 3:
            small = im.resize((QUAD * 2 // 3, QUAD), Image.Resampling.BILINEAR)
            im = Image.new("RGB", (QUAD, QUAD))
            im.paste(small, ((QUAD - small.width) // 2, 0))
        return im


@lru_cache(maxsize=4)
def procedural_set() -> ProceduralStimuli:
    """The shared default set (one cache per process)."""
    return ProceduralStimuli()


# ---------------------------------------------------------------------------------------------
# Importer for the original iWISDM directory format
# ---------------------------------------------------------------------------------------------
#: metadata file types read by default; ``*.pkl`` only with ``allow_pickle`` (a pickle can run code)
META_SAFE_EXT = (".csv", ".json")
META_PICKLE_EXT = ".pkl"


def check_unique_categories(categories: Sequence[str], where: str) -> None:
    """Two categories of one name would be offered twice and answered as one: refuse them."""
    seen: Dict[str, int] = {}
    for i, name in enumerate(categories):
        key = " ".join(str(name).split()).casefold()
        if key in seen:
            raise input_error(f"two stimulus categories are named {name!r} (codes {seen[key]} and {i} in "
                              "order); category names must be unique", file=where, field="ctg")
        seen[key] = i


def _rows_from_json(obj: Any, path: str) -> Tuple[List[Dict], List[str]]:
    """Rows of a JSON metadata table: a list of row objects, or pandas' ``to_json()`` column form."""
    if isinstance(obj, list) and all(isinstance(r, dict) for r in obj):
        return obj, sorted({str(k) for r in obj for k in r})
    if isinstance(obj, dict) and obj and all(isinstance(v, (dict, list)) for v in obj.values()):
        cols = [str(c) for c in obj]
        first = obj[cols[0]]
        keys = list(first) if isinstance(first, dict) else list(range(len(first)))
        rows = []
        for key in keys:
            row: Dict[str, Any] = {} if "ref" in cols else {"ref": key}
            for c in cols:
                col = obj[c]
                try:
                    row[c] = col[key]
                except (KeyError, IndexError, TypeError):
                    raise input_error(f"column '{c}' has no value for row {key!r}", file=path, field=c) from None
            rows.append(row)
        return rows, sorted(set(cols) | {"ref"})
    raise input_error("JSON metadata must be a list of row objects or a mapping column -> {row: value}", file=path)


def _read_meta(path: str, allow_pickle: bool = False) -> List[Dict]:
    """Rows of a metadata table (CSV, JSON; a pandas pickle only when ``allow_pickle``)."""
    if path.endswith(".csv"):
        cols, rows = read_csv(path, "stimulus metadata")
    elif path.endswith(".json"):
        rows, cols = _rows_from_json(read_json(path, "stimulus metadata"), path)
    elif not allow_pickle:
        raise input_error("refusing to unpickle a metadata file: loading a pickle can run arbitrary code. "
                          "Convert it to CSV or JSON (ref, ctg_mod, obj_mod, ang_mod, ctg), or set "
                          "'allow_pickle: true' in the dataset config if you trust the file (unsafe)",
                          file=path, field="allow_pickle")
    else:
        obj = pickle.loads(read_bytes(path, "stimulus metadata"))  # noqa: S301 - only with allow_pickle: true (documented as unsafe)
        if hasattr(obj, "to_dict") and hasattr(obj, "columns"):
            cols = [str(c) for c in obj.columns]
            if "ref" not in cols:
                obj = obj.reset_index().rename(columns={"index": "ref"})
                cols = [str(c) for c in obj.columns]
            rows = obj.to_dict("records")
        elif isinstance(obj, list):
            rows = obj
            cols = sorted({k for r in rows for k in r})
        else:
            raise input_error("metadata pickle must hold a pandas DataFrame or a list of dicts", file=path)
    for col in META_COLUMNS:
        if col not in cols:
            raise input_error(f"metadata lacks column '{col}' (needs {', '.join(META_COLUMNS)})",
                              file=path, field=col)
    return rows


class DirectoryStimuli(StimulusSet):
    """Stimuli in the original iWISDM layout.

    ``root`` holds split folders (or is one split); each split holds a metadata table
    (``*.csv``, ``*.json``, or a pandas ``*.pkl`` read only with ``allow_pickle``) with columns
    ``ctg_mod``, ``obj_mod``, ``ang_mod`` (integer codes), optional ``ctg`` (category name) and
    optional ``ref`` (the image folder; default: the row index), and one ``<ref>/image.png`` per row.
    """

    def __init__(self, root: str, split: Optional[str] = None, allow_pickle: bool = False) -> None:
        root = os.path.abspath(os.path.expanduser(check_name(root, "stim_dir")))
        if not os.path.isdir(root):
            raise input_error("stimulus directory not found", file=root, field="stim_dir")
        split_dir = os.path.join(root, split) if split else root
        if not split and not self._meta_files(root):
            subs = [d for d in list_dir(root, "stimulus folder", kind="dir")
                    if self._meta_files(os.path.join(root, d))]
            if not subs:
                raise input_error("no metadata file (*.csv, *.json or *.pkl with ctg_mod, obj_mod, ang_mod) "
                                  "in the directory or its split folders", file=root, field="stim_dir")
            split_dir = os.path.join(root, subs[0])
        metas = self._meta_files(split_dir)
        if not metas:
            raise input_error("no metadata file (*.csv, *.json or *.pkl)", file=split_dir, field="stim_dir")
        meta_path = metas[0]
        rows = _read_meta(meta_path, allow_pickle)
        names: Dict[int, str] = {}
        table: Dict[Tuple[int, int, int], str] = {}
        for i, row in enumerate(rows):
            try:
                c, o, a = int(row["ctg_mod"]), int(row["obj_mod"]), int(row["ang_mod"])
            except (KeyError, TypeError, ValueError):
                raise input_error("ctg_mod/obj_mod/ang_mod must be integers", file=meta_path,
                                  record=i, field="ctg_mod") from None
            ref = str(row.get("ref", i)) if row.get("ref", "") != "" else str(i)
            img = os.path.join(split_dir, ref, "image.png")
            if not os.path.isfile(img):
                raise input_error(f"image missing: {img}", file=meta_path, record=i, field="ref")
            table[(c, o, a)] = img
            if row.get("ctg"):
                name = str(row["ctg"])
                if names.setdefault(c, name) != name:
                    raise input_error(f"category code {c} is named both {names[c]!r} and {name!r}", file=meta_path,
                                      record=i, field="ctg")
        ctgs = sorted({k[0] for k in table})
        self.categories = tuple(names.get(c, f"category {c}") for c in ctgs)
        check_unique_categories(self.categories, meta_path)
        self._ctg_code = {name: code for name, code in zip(self.categories, ctgs)}
        objs = sorted({k[1] for k in table})
        angs = sorted({k[2] for k in table})
        missing = [(c, o, a) for c in ctgs for o in objs for a in angs if (c, o, a) not in table]
        if missing:
            raise input_error(f"incomplete grid: no row for (ctg_mod, obj_mod, ang_mod)={missing[0]} "
                              f"({len(missing)} missing)", file=meta_path, field="ang_mod")
        self._objs, self._angs = objs, angs
        self.n_identities, self.n_views = len(objs), len(angs)
        self._table = table
        self.source = split_dir
        self._cache: Dict[Tuple[str, int, int], Image.Image] = {}
        logger.info("iWISDM stimuli from %s: %d categories x %d objects x %d views", split_dir,
                    len(ctgs), len(objs), len(angs))

    @staticmethod
    def _meta_files(d: str) -> List[str]:
        """Metadata tables of a split folder, CSV/JSON before pickles (a pickle is read only if it is all there is)."""
        found = list_dir(d, "stimulus folder", suffix=META_SAFE_EXT + (META_PICKLE_EXT,), kind="file")
        return [os.path.join(d, f) for f in sorted(found, key=lambda f: (f.endswith(META_PICKLE_EXT), f))]

    def codes(self, category: str, identity: int, view: int) -> Tuple[int, int, int]:
        return self._ctg_code[category], self._objs[identity], self._angs[view]

    def from_codes(self, ctg: int, obj: int, ang: int) -> Optional[Tuple[str, int, int]]:
        names = {code: name for name, code in self._ctg_code.items()}
        if ctg in names and obj in self._objs and ang in self._angs:
            return names[ctg], self._objs.index(obj), self._angs.index(ang)
        return None

    def stimulus(self, category: str, identity: int, view: int) -> Image.Image:
        key = (category, identity, view)
        im = self._cache.get(key)
        if im is None:
            path = self._table[(self._ctg_code[category], self._objs[identity], self._angs[view])]
            im = open_image(path).resize((QUAD, QUAD), Image.Resampling.BILINEAR)
            self._cache[key] = im
        return im


def load_stimuli(stim_dir: Optional[str] = None, split: Optional[str] = None,
                 allow_pickle: bool = False) -> StimulusSet:
    """The procedural set (``stim_dir`` None/'procedural') or an imported directory."""
    if stim_dir in (None, "", "procedural", "builtin"):
        return procedural_set()
    return DirectoryStimuli(str(stim_dir), split, allow_pickle=allow_pickle)
