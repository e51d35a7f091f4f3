"""One interface module per LMM family; each registers itself with ``models.register_model``."""
