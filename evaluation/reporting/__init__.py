"""Scoring, comparison and report writing.

``report.compare_runs`` / ``report.write_run_report`` write the comparison tables with
bootstrap intervals, paired tests, plots and report.html. Kept import-light on purpose:
import the submodule you need (plots pull in matplotlib)."""
