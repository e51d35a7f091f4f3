"""Score prediction files offline: ``python run_loader_eval.py --prediction_file ...``.

The command line lives in ``reform_eval/run_loader_eval.py`` (the console command
``run_loader_eval`` runs the same); this file only starts it from a clone.
"""
from reform_eval.run_loader_eval import cli

if __name__ == "__main__":
    cli()
