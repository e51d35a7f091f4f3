"""The engine and reporting (layer 3): run a typed configuration, merge, score, report.

    from reform_eval.evaluation import RunConfig, ModelConfig, DatasetConfig, evaluate, score

Layers, lowest first (an import never goes up): ``utils`` -> ``build`` / ``models`` /
``metrics`` -> ``evaluation`` -> the command lines. See docs/architecture.md.
"""

if not __name__.startswith("reform_eval."):  # this folder reached under its short name: one copy only
    from reform_eval import refuse_short_name
    refuse_short_name(__name__)
from .config import (DatasetConfig, GenerationConfig, ModelConfig, OutputConfig, RunConfig,
                               ScoringConfig)
from .engine import RunResult, ScoreResult, evaluate, score
from ..models.tiny import SHIPPED_VERSIONS, register_tiny_builder

# the known-skill checkpoint's trainer, registered by name: torch and transformers load only when
# a shipped copy is unusable and it must be trained (evaluation.training registers the same)
register_tiny_builder("llava", "reform_eval.evaluation.training:build_trained_llava", version=SHIPPED_VERSIONS["llava/trained"],
                      size="trained")

__all__ = ["RunConfig", "ModelConfig", "DatasetConfig", "GenerationConfig", "ScoringConfig", "OutputConfig",
           "evaluate", "score", "RunResult", "ScoreResult"]
