"""The response cache and the run identity follow what the data holds, never where it lies or when
it was touched (issue 24): a file image is keyed by a hash of its bytes, remembered under its stat
key so each file is read once per machine (``utils.file_hashes``)."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading
import time

import pytest
from PIL import Image

from reform_eval import run_eval
from tests.conftest import write_custom_dataset
from tests.test_request_window import Server, dataset, ok_body, saved
from reform_eval.build import _load_image
from reform_eval.utils.errors import ReformError
from reform_eval.utils.file_hashes import FileHashes, file_digest, hash_bytes_of
from reform_eval.utils.run_images import open_run_image


@pytest.fixture
def counting(monkeypatch):
    monkeypatch.delenv("REFORM_NO_CACHE", raising=False)
    server = Server(lambda body, n: (0.0, 200, {}, ok_body("red")))
    yield server
    server.close()


def _run(server: Server, cfg: str, out, cache) -> int:
    before = len(server.bodies)
    assert run_eval.main(["--model", "openai_api", "--model_name", "gpt-test", "--dataset_name", "custom",
                          "--formulation", "Generation", "--dataset_config", cfg, "--output_dir", str(out),
                          "--cache_dir", str(cache), "--model_option", f"base_url={server.url}"]) == 0
    return len(server.bodies) - before


def test_moved_touched_edited_data_costs_exactly_the_changed_requests(counting, tmp_path):
    cfg = dataset(tmp_path, 8)
    cache = tmp_path / "cache"
    assert _run(counting, cfg, tmp_path / "out1", cache) == 8
    # the same data in another folder, every image touched: nothing is asked again
    moved = tmp_path / "elsewhere" / "data"
    shutil.copytree(tmp_path / "data", moved)
    later = time.time() + 3600
    for name in os.listdir(moved):
        os.utime(moved / name, (later, later))
    assert _run(counting, str(moved / "custom.yaml"), tmp_path / "out2", cache) == 0
    # one pixel of one image changed: that sample only
    img = Image.open(moved / "img3.png").convert("RGB")
    img.putpixel((0, 0), (1, 2, 3))
    img.save(moved / "img3.png")
    assert _run(counting, str(moved / "custom.yaml"), tmp_path / "out3", cache) == 1
    # one question edited: that sample only
    items = [json.loads(x) for x in (moved / "items.jsonl").read_text().splitlines()]
    items[5]["question"] = "Which colour fills image five?"
    (moved / "items.jsonl").write_text("".join(json.dumps(r) + "\n" for r in items))
    assert _run(counting, str(moved / "custom.yaml"), tmp_path / "out4", cache) == 1
    assert len(saved(tmp_path / "out4")) == 8


def test_the_run_identity_ignores_where_the_data_lies(tmp_path):
    """The data fingerprint is the same for a copy elsewhere with new modification times (the
    prediction file of the copy is then the same run's)."""
    from reform_eval.evaluation.config import RunConfig, build_parser
    from reform_eval.evaluation.plan import make_plan, read_dataset_config

    def plan_of(cfg: str):
        config = RunConfig.from_namespace(build_parser().parse_args(
            ["--model", "random", "--dataset_name", "custom", "--formulation", "Generation", "--dataset_config", cfg,
             "--output_dir", str(tmp_path / "o")])).validated()
        path, content = read_dataset_config(config)
        return make_plan(config, path, content)
    cfg = dataset(tmp_path, 5)
    a = plan_of(cfg)
    moved = tmp_path / "copy"
    shutil.copytree(tmp_path / "data", moved)
    for name in os.listdir(moved):
        os.utime(moved / name, (1, 1))
    b = plan_of(str(moved / "custom.yaml"))
    assert a.fingerprint == b.fingerprint and a.run_id == b.run_id
    Image.new("RGB", (32, 32), (0, 0, 1)).save(moved / "img0.png")
    assert plan_of(str(moved / "custom.yaml")).fingerprint != a.fingerprint


def test_a_path_given_as_a_dataset_option_is_where_the_data_lies_not_what_it_is(tmp_path):
    """``--dataset_option data_file=...`` (or MME's ``root=...``) names a folder; the same data in
    another folder is the same run (the docs' blocks run in a new scratch folder each time and
    showed another run id each time)."""
    from reform_eval.evaluation.config import RunConfig, build_parser
    from reform_eval.evaluation.plan import make_plan, read_dataset_config

    def plan_of(data_file: str):
        config = RunConfig.from_namespace(build_parser().parse_args(
            ["--model", "random", "--dataset_name", "custom", "--formulation", "Generation", "--dataset_config", cfg,
             "--dataset_option", f"data_file={data_file}", "--output_dir", str(tmp_path / "o")])).validated()
        path, content = read_dataset_config(config)
        return make_plan(config, path, content)
    cfg = dataset(tmp_path, 5)
    a = plan_of(str(tmp_path / "data" / "items.jsonl"))
    moved = tmp_path / "copy"
    shutil.copytree(tmp_path / "data", moved)
    b = plan_of(str(moved / "items.jsonl"))
    assert a.fingerprint == b.fingerprint and a.run_id == b.run_id
    (moved / "items.jsonl").write_text((moved / "items.jsonl").read_text().replace("colour", "color", 1))
    assert plan_of(str(moved / "items.jsonl")).run_id != a.run_id


def test_an_mme_release_in_another_folder_is_the_same_run(tmp_path):
    """MME samples named their question file by its absolute path (meta.source_file), so the same
    release in another folder was another run (and every docs block another run id)."""
    from reform_eval.build.mme_synthetic import write_yesno_release
    from reform_eval.evaluation.config import RunConfig, build_parser
    from reform_eval.evaluation.plan import make_plan, read_dataset_config

    def plan_of(root: str):
        config = RunConfig.from_namespace(build_parser().parse_args(
            ["--model", "random", "--dataset_name", "MME", "--dataset_config", "mme_synthetic",
             "--dataset_option", f"root={root}", "--output_dir", str(tmp_path / "o")])).validated()
        path, content = read_dataset_config(config)
        return make_plan(config, path, content)
    write_yesno_release(str(tmp_path / "a"), n_images=2)
    write_yesno_release(str(tmp_path / "b"), n_images=2)
    assert plan_of(str(tmp_path / "a")).run_id == plan_of(str(tmp_path / "b")).run_id


def test_each_file_is_read_once_per_stat_key(tmp_path):
    f = tmp_path / "x.bin"
    f.write_bytes(b"abc" * 1000)
    memo = FileHashes(str(tmp_path / "memo"))
    first = memo.digest(str(f))
    assert first == hash_bytes_of(str(f)) and memo.read_files == 1
    assert memo.digest(str(f)) == first and memo.read_files == 1
    again = FileHashes(str(tmp_path / "memo"))  # another process: the memo is on disk
    assert again.digest(str(f)) == first and again.read_files == 0
    os.utime(f, (5, 5))  # touched: read once more, same content hash
    assert again.digest(str(f)) == first and again.read_files == 1
    f.write_bytes(b"abd" * 1000)
    assert again.digest(str(f)) != first


def test_in_memory_pictures_with_the_same_bytes_are_other_images(tmp_path):
    """A 40x30 and a 30x40 blank (what --image_ablation blank makes of a landscape and a portrait
    image) have the same ``tobytes()``: every name of an in-memory image (the saved file of
    ``image_paths``, the run identity's token, the API client's encoded-image memo) comes from
    ``utils.fingerprint.pixel_digest``, which hashes mode and size too. Before, the saved files
    hashed the bytes alone and the portrait's record pointed at the landscape's file."""
    from reform_eval.evaluation.calls import save_sample_images
    from reform_eval.models.openai_messages import EncodedImages
    from reform_eval.utils.fingerprint import image_token, pixel_digest

    land, port, grey = Image.new("RGB", (40, 30)), Image.new("RGB", (30, 40)), Image.new("L", (60, 60))
    a = save_sample_images({"images": [land]}, str(tmp_path))[0]
    b = save_sample_images({"images": [port]}, str(tmp_path))[0]
    assert a != b
    with Image.open(os.path.join(tmp_path, b)) as im:
        assert im.size == (30, 40)
    assert len({pixel_digest(land), pixel_digest(port), pixel_digest(grey)}) == 3
    assert image_token(land, {}) == "pixels:" + pixel_digest(land) != image_token(port, {})
    memo = EncodedImages("PNG")  # one shared key would hand the portrait the landscape's url
    assert memo.url(land) != memo.url(port)


def test_an_image_replaced_during_the_run_is_refused_not_cached_under_its_old_key(tmp_path, monkeypatch, capsys):
    """An image file replaced during a run. The run's identity and every cache key hold the file's
    content as it was when the run started, but the request encoded the file as it was when the
    sample's turn came: the answer about the NEW picture was stored under the OLD picture's key,
    and once the file was back (a reverted edit, a re-synced dataset) a later run was served that
    answer for the old picture. Now the bytes sent are the bytes whose hash is the key, and a file
    whose content is no longer what the run fingerprinted is refused in one line (exit 2; what
    was answered is saved; a re-run evaluates the file as it is then).

    (The review's reproducer expected the first run to finish (exit 0); without keeping every
    image's bytes from the start, the run cannot send the picture its keys name, so it stops.)"""
    monkeypatch.delenv("REFORM_NO_CACHE", raising=False)
    cfg = write_custom_dataset(str(tmp_path / "data"), n=2, formulation="Generation")
    img1 = tmp_path / "data" / "img1.png"
    original = img1.read_bytes()
    gate = threading.Event()

    def respond(body, n):
        if n == 0:
            gate.wait(20)  # sample q0 in flight: the test edits q1's picture meanwhile
        urls = [p["image_url"]["url"] for m in body["messages"] if isinstance(m["content"], list)
                for p in m["content"] if p.get("type") == "image_url"]
        return 0.0, 200, {}, ok_body("pic-" + hashlib.sha256("".join(urls).encode()).hexdigest()[:8])
    server = Server(respond)
    try:
        argv = ["--model", "openai_api", "--model_name", "m", "--dataset_name", "custom", "--formulation",
                "Generation", "--dataset_config", cfg, "--max_new_tokens", "5", "--cache_dir", str(tmp_path / "cache"),
                "--model_option", f"base_url={server.url}", "--model_option", "max_concurrency=1",
                "--model_option", "max_retries=0"]
        result = []
        t = threading.Thread(target=lambda: result.append(run_eval.main(argv + ["--output_dir", str(tmp_path / "a")])))
        t.start()
        while not server.bodies:
            pass
        Image.new("RGB", (32, 32), (1, 2, 3)).save(img1)  # replaced while the run is going
        gate.set()
        t.join(60)
        assert result == [2]
        errors = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("error")]
        assert len(errors) == 1 and "img1.png" in errors[0] and "image file changed during the run" in errors[0], errors
        img1.write_bytes(original)  # the edit is reverted
        assert run_eval.main(argv + ["--output_dir", str(tmp_path / "b")]) == 0
        fresh = Server(respond)
        gate.set()
        argv_fresh = [a if not a.startswith("base_url=") else f"base_url={fresh.url}" for a in argv]
        assert run_eval.main(argv_fresh + ["--no_cache", "--output_dir", str(tmp_path / "c")]) == 0
        fresh.close()
    finally:
        server.close()
    cached = {r["sample_id"]: r["prediction"] for r in saved(tmp_path / "b")}
    truth = {r["sample_id"]: r["prediction"] for r in saved(tmp_path / "c")}
    assert cached == truth, f"served from the cache: {cached}, asked afresh: {truth}"


def test_every_reader_at_a_samples_turn_gets_the_fingerprinted_content(tmp_path):
    """The on-device models read images through ``open_run_image`` (``build._load_image``,
    ``models.hf_inputs``): the same refusal as the endpoint client's, one line naming the file;
    a file the run never fingerprinted is read as it is, and a fingerprint taken again (the next
    run) is what counts."""
    path = str(tmp_path / "a.png")
    Image.new("RGB", (8, 8), (255, 0, 0)).save(path)
    file_digest(path)
    assert open_run_image(path).getpixel((0, 0)) == (255, 0, 0)
    time.sleep(0.01)
    Image.new("RGB", (8, 8), (0, 0, 255)).save(path)
    with pytest.raises(ReformError, match=r"a\.png.*image file changed during the run"):
        _load_image(path, record="q7")
    file_digest(path)  # a new run fingerprints the file again
    assert open_run_image(path).getpixel((0, 0)) == (0, 0, 255)
    other = str(tmp_path / "b.png")
    Image.new("RGB", (8, 8), (0, 255, 0)).save(other)
    assert open_run_image(other).getpixel((0, 0)) == (0, 255, 0)
