"""Scoring, comparison and report writing.

``compare.compare_runs`` / ``compare.write_run_report`` write the comparison tables with
bootstrap intervals, paired tests, plots and report.html. Kept import-light on purpose:
import the submodule you need (plots pull in matplotlib)."""
