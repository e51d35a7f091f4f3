"""Evaluate one model on one benchmark: ``python run_eval.py ...`` or ``torchrun ... run_eval.py ...``.

The command line lives in ``reform_eval/run_eval.py`` (the console command ``run_eval`` runs
the same); this file only starts it from a clone, with or without an installation.
"""
from reform_eval.run_eval import cli

if __name__ == "__main__":
    cli()
