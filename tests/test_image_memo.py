"""The image check and content memo where the run's fingerprint reads an image file
(``utils.file_hashes.FileHashes.digest``, ``utils.fingerprint.image_token``) and the model's read
of it (``utils.run_images.read_run_image``): names that are not UTF-8, the pixel limit in force,
``..`` through a symlinked folder, and fingerprints scoped to one run. Found by an adversarial
review; each failed before its fix."""
from __future__ import annotations

import io
import os

import pytest
from PIL import Image

from reform_eval.utils.errors import ReformError
from reform_eval.utils.file_hashes import FileHashes, _check_image, hash_bytes_of
from reform_eval.utils.fingerprint import image_token
from reform_eval.utils.run_images import read_run_image


def _png(color, size=(4, 4)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, format="PNG")
    return buf.getvalue()


def test_valid_image_whose_name_is_not_utf8_is_fingerprinted(tmp_path, monkeypatch):
    """A file name holding a byte that is not UTF-8 (a Latin-1 ``caf\\xe9.png``, common in old
    image folders; Python hands it over as the surrogate ``\\udce9``) is a readable image. The
    memo writes its line with ``ensure_ascii=False`` and encodes it strictly as UTF-8, so the
    ``UnicodeEncodeError`` (a ValueError) escapes ``digest`` and ``image_token`` refuses the
    valid image: 'image cannot be read ('utf-8' codec can't encode character '\\udce9' ...)'
    (exit 2 for the whole run)."""
    monkeypatch.setenv("REFORM_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "imgs"
    folder.mkdir()
    raw = os.path.join(os.fsencode(str(folder)), b"caf\xe9.png")
    with open(raw, "wb") as f:
        f.write(_png((200, 10, 10)))
    path = os.fsdecode(raw)
    assert "\udce9" in path
    want = "file:" + hash_bytes_of(path)
    assert image_token(path, {}, "s1") == want
    # and a fresh process finds it in the memo, without a crash on reading the line back
    memo = FileHashes(str(tmp_path / "memo"), check=_check_image)
    assert memo.digest(path) == want[len("file:"):]
    again = FileHashes(str(tmp_path / "memo"), check=_check_image)
    assert again.digest(path) == want[len("file:"):] and again.read_files == 0


def test_memo_does_not_bypass_a_lower_pixel_limit(tmp_path, monkeypatch):
    """Only a file that passed the check is remembered, and a remembered file is not checked
    again. But the check depends on ``REFORM_MAX_IMAGE_PIXELS``: a file remembered by a run with
    a raised limit passes every later run's fingerprint under the default limit, so the promise
    'an oversized image is refused before any work, whatever the model, a baseline included'
    (docs/reliability.md) holds on a fresh machine and not on one whose memo has seen the file:
    the same command exits 2 on one machine and runs on the other (an HF model then meets the
    refusal mid-run, at the sample's decode)."""
    path = tmp_path / "big.png"
    path.write_bytes(_png((0, 0, 0), size=(100, 100)))  # 10,000 pixels
    memo_dir = str(tmp_path / "memo")
    monkeypatch.setenv("REFORM_MAX_IMAGE_PIXELS", "1000000")
    FileHashes(memo_dir, check=_check_image).digest(str(path))  # an earlier run, limit raised
    monkeypatch.setenv("REFORM_MAX_IMAGE_PIXELS", "1000")
    fresh = FileHashes(str(tmp_path / "other_memo"), check=_check_image)
    with pytest.raises(ReformError, match="too large"):
        fresh.digest(str(path))  # a machine without the memo: refused
    later = FileHashes(memo_dir, check=_check_image)  # the machine whose memo saw the file
    with pytest.raises(ReformError, match="too large"):
        later.digest(str(path))


def test_dotdot_through_a_symlinked_folder_is_not_a_changed_file(tmp_path, monkeypatch):
    """``fingerprinted`` is keyed by ``os.path.abspath`` (lexical: ``link/../a.png`` becomes
    ``<tmp>/a.png``) while ``stat`` and ``open`` resolve the path physically (``link/..`` is
    ``real``, so the file read is ``real/a.png``). Two samples naming ``<tmp>/link/../a.png`` and
    ``<tmp>/a.png``, two different files, share one entry: the second fingerprint overwrites the
    first, and at the first sample's turn its unchanged file is refused as 'image file changed
    during the run' (restoring or re-running cannot help)."""
    monkeypatch.setenv("REFORM_CACHE", str(tmp_path / "cache"))
    (tmp_path / "real" / "sub").mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / "real" / "sub")
    (tmp_path / "real" / "a.png").write_bytes(_png((255, 0, 0)))
    (tmp_path / "a.png").write_bytes(_png((0, 255, 0)))
    via_link = str(tmp_path / "link" / ".." / "a.png")  # physically real/a.png
    plain = str(tmp_path / "a.png")
    assert hash_bytes_of(via_link) != hash_bytes_of(plain)
    image_token(via_link, {}, "s1")
    image_token(plain, {}, "s2")  # the run fingerprints both samples, then runs them
    data, digest = read_run_image(via_link, "s1")  # nothing changed: the file as fingerprinted
    assert digest == hash_bytes_of(via_link)
    data, digest = read_run_image(plain, "s2")
    assert digest == hash_bytes_of(plain)


def test_a_run_s_fingerprints_end_with_the_run(tmp_path, monkeypatch):
    """``load_reform_dataset`` (or a second run) in a process where a run fingerprinted a file
    takes the file as it is now: the 'changed during the run' promise is the run's only."""
    from reform_eval.utils.file_hashes import forget_fingerprints
    monkeypatch.setenv("REFORM_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "a.png"
    path.write_bytes(_png((1, 2, 3)))
    image_token(str(path), {}, "s1")
    path.write_bytes(_png((4, 5, 6)))
    with pytest.raises(ReformError, match="changed during the run"):
        read_run_image(str(path), "s1")
    forget_fingerprints()
    assert read_run_image(str(path), "s1")[1] == hash_bytes_of(str(path))


def test_an_unreadable_format_names_the_file_not_a_stream(tmp_path, monkeypatch):
    monkeypatch.setenv("REFORM_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "junk.png"
    path.write_bytes(b"not an image at all")
    with pytest.raises(ReformError) as e:
        image_token(str(path), {}, "s7")
    assert "sample s7" in str(e.value) and "junk.png" in str(e.value) and "BytesIO" not in str(e.value)


def test_another_name_for_an_encoded_picture_is_not_read_again(tmp_path, monkeypatch):
    """The endpoint client (issue 24): a file whose stat is what the run fingerprinted, and whose
    picture is already encoded under another name, is sent from that encoding without a read;
    a file changed since the fingerprint (new stat) is read, and refused."""
    import reform_eval.models.openai_messages as om
    from reform_eval.utils.file_hashes import forget_fingerprints
    monkeypatch.setenv("REFORM_CACHE", str(tmp_path / "cache"))
    forget_fingerprints()
    red, blue = _png((200, 0, 0)), _png((0, 0, 200))
    paths = []
    for name in ("a.png", "b.png", "c.png"):
        (tmp_path / name).write_bytes(red)
        paths.append(str(tmp_path / name))
    (tmp_path / "d.png").write_bytes(blue)
    for i, p in enumerate(paths + [str(tmp_path / "d.png")]):
        image_token(p, {}, f"s{i}")  # the run's fingerprint
    reads = []
    real = om.read_run_image
    monkeypatch.setattr(om, "read_run_image", lambda p, *a: reads.append(os.path.basename(p)) or real(p, *a))
    images = om.EncodedImages("PNG")
    first = images.url(paths[0])
    assert images.url(paths[1]) == first and reads == ["a.png"]
    assert images.url(str(tmp_path / "d.png")) != first and reads == ["a.png", "d.png"]
    (tmp_path / "c.png").write_bytes(blue)  # replaced after the fingerprint, before its turn
    with pytest.raises(ReformError, match="changed during the run"):
        images.url(paths[2])
    assert reads[-1] == "c.png"
    forget_fingerprints()
    assert om.unchanged_digest(paths[1]) is None  # no run: nothing is taken on trust


# -- issue 31 class 4: the memo is never believed over the file --------------------------------

def _memo_lines(folder: str):
    import json
    out = []
    for name in sorted(os.listdir(folder)):
        with open(os.path.join(folder, name), encoding="utf-8") as f:
            out += [(name, json.loads(line)) for line in f]
    return out


def _rewrite(folder: str, change) -> None:
    """Every memo line of ``folder`` passed through ``change(entry) -> entry``, as valid JSON."""
    import json
    for name in os.listdir(folder):
        path = os.path.join(folder, name)
        with open(path, encoding="utf-8") as f:
            entries = [json.loads(line) for line in f]
        with open(path, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(change(e)) + "\n" for e in entries)


WRONG = "0123456789abcdef" * 2


def test_a_damaged_memo_line_is_not_believed(tmp_path):
    """A line of valid JSON whose hash is wrong (a damaged disk block, an edit): the file is read
    again and hashed to its content (the wrong hash was believed: every later run refused the
    unchanged file as 'changed during the run')."""
    path = tmp_path / "imgs" / "a.png"
    path.parent.mkdir()
    path.write_bytes(_png((10, 20, 30)))
    memo_dir = str(tmp_path / "memo")
    want = FileHashes(memo_dir, check=_check_image).digest(str(path))
    (folder,) = [os.path.join(memo_dir, d) for d in os.listdir(memo_dir)]
    _rewrite(folder, lambda e: dict(e, h=WRONG))
    again = FileHashes(memo_dir, check=_check_image)
    assert again.digest(str(path)) == want and again.read_files == 1


def _forge_wrong_entry(fh, path: str, tmp_path) -> str:
    """The memo's line for ``path`` made to name WRONG, with a valid check sum; a new process."""
    folder = fh._memo._memo(str(tmp_path), fh._memo.variant()).folder
    _rewrite(folder, lambda e: {"f": e["f"], "k": e["k"], "h": WRONG, "c": fh._line_check(e["f"], e["k"], WRONG)})
    fh._memo._dirs.clear()  # a new process: the memo is read from its files
    fh.forget_fingerprints()
    return folder


def test_a_memo_entry_that_disagrees_with_the_file_is_replaced_and_the_run_stops(tmp_path, monkeypatch):
    """An entry the memo holds in good form but wrong (its check sum made for the wrong hash):
    the run's read of the unchanged file finds the disagreement, replaces the entry and stops in
    one line (it went on with a run identity and image_sha made from the wrong hash); the next
    process hashes the file again, so a damaged line never makes every later run fail."""
    import reform_eval.utils.file_hashes as fh
    monkeypatch.setenv("REFORM_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(fh._memo, "_dirs", {})
    path = str(tmp_path / "a.png")
    with open(path, "wb") as f:
        f.write(_png((1, 200, 3)))
    want = hash_bytes_of(path)
    image_token(path, {}, "s1")  # the memo gets its line
    folder = _forge_wrong_entry(fh, path, tmp_path)
    assert image_token(path, {}, "s1") == "file:" + WRONG  # the run's fingerprint took the memo's word
    assert fh.unchanged_digest(path) is None  # ... so nothing is sent on that word without a read
    with pytest.raises(ReformError, match="image memo named another content .* corrected: run the command again"):
        read_run_image(path, "s1")
    fh._memo._dirs.clear()
    fh.forget_fingerprints()
    assert image_token(path, {}, "s1") == "file:" + want  # the next run is right
    read_run_image(path, "s1")
    memo = FileHashes(os.path.dirname(folder), check=_check_image)
    assert memo.digest(path) == want and memo.read_files == 1  # the two disagreeing lines: neither believed
    fh.forget_fingerprints()


def test_a_cached_answer_is_not_used_on_the_memo_s_word_alone(tmp_path, monkeypatch):
    """The response cache path: a sample whose image fingerprint came from the memo is read once
    before its cached answer is used (the forged entry gave the other picture's cached answer,
    the file never read); a file this run hashed itself costs no read."""
    import reform_eval.utils.file_hashes as fh
    from reform_eval.utils.run_images import verify_run_images
    monkeypatch.setenv("REFORM_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(fh._memo, "_dirs", {})
    path = str(tmp_path / "c.png")
    with open(path, "wb") as f:
        f.write(_png((5, 6, 7)))
    image_token(path, {}, "s1")
    reads = []
    real = fh._read_regular_stat
    monkeypatch.setattr(fh, "_read_regular_stat", lambda p: reads.append(p) or real(p))
    verify_run_images([path], "s1")
    assert reads == []  # hashed from its bytes by this run: one stat
    _forge_wrong_entry(fh, path, tmp_path)
    image_token(path, {}, "s1")
    with pytest.raises(ReformError, match="image memo named another content"):
        verify_run_images([path], "s1")
    fh.forget_fingerprints()


def test_a_real_change_during_the_run_is_still_refused(tmp_path, monkeypatch):
    import reform_eval.utils.file_hashes as fh
    monkeypatch.setenv("REFORM_CACHE", str(tmp_path / "cache"))
    path = str(tmp_path / "b.png")
    with open(path, "wb") as f:
        f.write(_png((9, 9, 9)))
    image_token(path, {}, "s1")
    monkeypatch.setattr(fh._memo, "_dirs", {})
    fh.forget_fingerprints()
    image_token(path, {}, "s1")  # from the memo this time
    with open(path, "wb") as f:
        f.write(_png((250, 9, 9)))
    with pytest.raises(ReformError, match="changed during the run"):
        read_run_image(path, "s1")
    fh.forget_fingerprints()


class _StatOfSize:
    """A file's stat as it was when the file had ``size`` bytes (a file that changed after it)."""

    def __init__(self, st, size):
        self._st = st
        self.st_size = size

    def __getattr__(self, name):
        return getattr(self._st, name)


def test_a_regular_read_is_whole_when_the_file_grew_after_its_stat(tmp_path, monkeypatch):
    """The request path reads a file in one ``read`` of its stat size plus one byte (a file
    object cost six more system calls, each a hand-over of the interpreter lock); a file that
    grew between the stat and the read is still read to its end, and a FIFO is refused."""
    import reform_eval.utils.file_hashes as fh
    path = tmp_path / "g.bin"
    data = bytes(range(256)) * 8000  # 2 MB: more than one read of the rest
    path.write_bytes(data)
    assert fh.read_regular(str(path)) == data
    real = os.fstat

    def Shrunk(st):  # the stat as it was before the file grew to its present size
        return _StatOfSize(st, 10)
    monkeypatch.setattr(fh.os, "fstat", lambda fd: Shrunk(real(fd)))
    assert fh.read_regular(str(path)) == data
    monkeypatch.undo()
    stats = iter([Shrunk])  # grown after the first stat only: the stat given is the one after the read
    monkeypatch.setattr(fh.os, "fstat", lambda fd: next(stats, lambda st: st)(real(fd)))
    got, st = fh._read_regular_stat(str(path))
    assert (got, st.st_size) == (data, len(data))
    monkeypatch.undo()
    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    with pytest.raises(OSError, match="not a regular file"):
        fh.read_regular(str(fifo))


def test_a_short_read_is_not_taken_for_the_end_of_the_file(tmp_path, monkeypatch):
    """One ``read`` may return fewer bytes than asked though the file goes on: Linux caps a single
    read at 2 GiB - 4 KiB (a larger image, or a ``.npy`` frame stack, came back cut there), and a
    network or FUSE filesystem may return any part. A read shorter than the stat's size is followed
    by reads to the end, so the bytes are whole (here reads are capped at 1000 bytes)."""
    import reform_eval.utils.file_hashes as fh
    path = tmp_path / "big.bin"
    data = bytes(range(256)) * 40  # 10240 bytes: eleven capped reads
    path.write_bytes(data)
    real, calls = os.read, []
    monkeypatch.setattr(fh.os, "read", lambda fd, n: calls.append(n) or real(fd, min(n, 1000)))
    assert fh.read_regular(str(path)) == data
    monkeypatch.undo()
    shrunk = tmp_path / "shrunk.bin"  # a file that shrank after its stat ends at its end
    shrunk.write_bytes(data[:300])
    real_fstat = os.fstat
    # the stat as it was before the file shrank to its present size
    monkeypatch.setattr(fh.os, "fstat", lambda fd: _StatOfSize(real_fstat(fd), 5000))
    assert fh.read_regular(str(shrunk)) == data[:300]
    monkeypatch.undo()
    calls.clear()  # the usual file: still one read of its size plus one byte
    monkeypatch.setattr(fh.os, "read", lambda fd, n: calls.append(n) or real(fd, n))
    assert fh.read_regular(str(path)) == data and calls == [len(data) + 1]
