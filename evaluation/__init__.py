"""The engine and reporting (layer 3): run a typed configuration, merge, score, report.

Layers, lowest first (an import never goes up): ``utils`` -> ``build`` / ``models`` /
``metrics`` -> ``evaluation`` -> the command lines. See docs/architecture.md.
"""
