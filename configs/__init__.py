"""Shipped configuration files (package data): ``datasets/*.yaml`` and small ``data/`` files,
so ``--dataset_config iwisdm_high`` works by name from any directory after ``pip install .``."""

if not __name__.startswith("reform_eval."):  # this folder reached under its short name: one copy only
    from reform_eval import refuse_short_name
    refuse_short_name(__name__)
