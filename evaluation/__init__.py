"""The engine and reporting (layer 3): run a typed configuration, merge, score, report.

    from evaluation import RunConfig, ModelConfig, DatasetConfig, evaluate, score

Layers, lowest first (an import never goes up): ``utils`` -> ``build`` / ``models`` /
``metrics`` -> ``evaluation`` -> the command lines. See docs/architecture.md.
"""
from evaluation.config import (DatasetConfig, GenerationConfig, ModelConfig, OutputConfig, RunConfig,
                               ScoringConfig)
from evaluation.engine import RunResult, ScoreResult, evaluate, score
from evaluation.training import build_trained_llava  # registers the known-skill checkpoint's builder

__all__ = ["RunConfig", "ModelConfig", "DatasetConfig", "GenerationConfig", "ScoringConfig", "OutputConfig",
           "evaluate", "score", "RunResult", "ScoreResult"]
