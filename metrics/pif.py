"""MMMT-IF: the instruction checkers and the PIF family of metrics, under one name.

The paper (MMMT-IF, Table 6) lists 13 instructions in 6 categories but does not publish
how a response is split into sentences or what a word or a number is. Those definitions
are written out in docs/mmmt_if.md and live, by concept, in:

- build/mmmt_if_instructions.py: the instruction set and the recognition of its texts;
- metrics/pif_lines.py: lines, blocks and list markers; metrics/pif_sentences.py: sentences;
- metrics/pif_words.py: words and numbers;
- metrics/pif_checkers.py: the 13 checkers on one parse, ``check_instructions``, ``pif``;
- metrics/pif_scores.py: the registered metric ``pif`` and its corpus statistics;
- metrics/mmmt_if_release.py: the release's own scores (and its prediction-file reader).

This module re-exports their public names so that ``from reform_eval.metrics.pif import ...`` keeps
working, and importing it registers the metric and the release CSV reader.
"""
from __future__ import annotations

from ..build.mmmt_if_instructions import (CATEGORIES, CATEGORY_OF, INSTRUCTION_IDS, INSTRUCTION_TEXTS,
                                        instruction_id, split_instruction_list, split_instruction_prefix)
from . import mmmt_if_release  # noqa: F401  (registers the release CSV reader)
from .pif_checkers import (CHECKERS, ParsedResponse, check_end_char_exclamation,
                                  check_end_char_question, check_favourite_word_itself,
                                  check_favourite_word_like, check_favourite_word_per_se, check_instruction,
                                  check_instructions, check_number_even, check_number_odd,
                                  check_response_length_long, check_response_length_short,
                                  check_sentence_length_long, check_sentence_length_short, check_start_char_B,
                                  check_start_char_S, explain_instruction, pif, verdicts)
from .pif_scores import (IQR_METHOD, bernoulli_ci, ecdf, iqr, pif_metric, pif_n_k, sample_fields,
                                summarize)
from .pif_sentences import (MAYBE_END, NEVER_END, SENTENCE_STARTERS, TITLES, first_alnum, last_mark,
                                   split_sentences)
from .pif_words import count_words, find_integers

__all__ = [
    "CATEGORIES", "CATEGORY_OF", "INSTRUCTION_IDS", "INSTRUCTION_TEXTS", "instruction_id",
    "split_instruction_list", "split_instruction_prefix", "CHECKERS", "ParsedResponse", "check_instruction",
    "check_instructions", "explain_instruction", "pif", "verdicts", "IQR_METHOD", "bernoulli_ci", "ecdf", "iqr",
    "pif_metric", "pif_n_k", "sample_fields", "summarize", "MAYBE_END", "NEVER_END", "SENTENCE_STARTERS",
    "TITLES", "first_alnum", "last_mark", "split_sentences", "count_words", "find_integers",
    "check_end_char_exclamation", "check_end_char_question", "check_favourite_word_itself",
    "check_favourite_word_like", "check_favourite_word_per_se", "check_number_even", "check_number_odd",
    "check_response_length_long", "check_response_length_short", "check_sentence_length_long",
    "check_sentence_length_short", "check_start_char_B", "check_start_char_S",
]
