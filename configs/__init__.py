"""Shipped configuration files (package data): ``datasets/*.yaml`` and small ``data/`` files,
so ``--dataset_config iwisdm_high`` works by name from any directory after ``pip install .``."""
