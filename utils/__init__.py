"""Shared helpers: errors, prediction I/O, distributed helpers, preprocessors, logging."""

if not __name__.startswith("reform_eval."):  # this folder reached under its short name: one copy only
    from reform_eval import refuse_short_name
    refuse_short_name(__name__)
