"""``python -m reform_eval.build``: not a command (``python -m build`` typed in a clone's root is
handed to PyPA's build by ``reform_eval.refuse_short_name`` before this runs)."""
import sys

sys.exit("reform_eval.build holds the dataset builders, not a command (to make a wheel: python -m build)")
