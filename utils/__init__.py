"""Shared helpers: errors, prediction I/O, distributed helpers, preprocessors, logging."""
