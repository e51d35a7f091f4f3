"""iWISDM at scale: the parser agrees with every stored answer, answers are balanced per root type."""
from __future__ import annotations

from collections import Counter, defaultdict
from typing import Dict, List, Tuple

import pytest

from reform_eval.build.iwisdm.instructions import InstructionParser
from reform_eval.build.iwisdm.presets import PRESETS, PresetSampler
from reform_eval.build.iwisdm.stimuli import LOCATIONS, procedural_set
from reform_eval.utils.seeding import rng_for

pytestmark = pytest.mark.slow  # (every preset generated at scale, about 15 s)

N_BALANCE = 10_000
N_PARSE = 3_000


@pytest.fixture(scope="module")
def generated() -> Dict[str, List[Tuple[str, str, list, str, int]]]:
    """10,000 trials per preset (metadata only; rendering is covered elsewhere)."""
    stim = procedural_set()
    out = {}
    for name, preset in PRESETS.items():
        sampler = PresetSampler(preset, stim, n_delay=[0, 1, 2, 3] if preset.dms_feature else None)
        picker = sampler.balanced_picker(rng_for(0, "scale", name, "balance"))  # as generate_trials does
        rows = []
        for i in range(N_BALANCE):
            _, tr = sampler.trial(rng_for(0, "scale", name, i), picker=picker)
            rows.append((tr.instruction, tr.answer, tr.frames, tr.response_type, len(tr.frames)))
        out[name] = rows
    return out


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_parser_agrees_with_every_answer(generated, preset):
    parser = InstructionParser(procedural_set().categories)
    rows = generated[preset]
    for instr, answer, frames, _, _ in rows[:N_PARSE]:
        assert parser.evaluate(instr, frames)[-1] == answer, instr


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_answers_balanced_within_each_root_type(generated, preset):
    spaces = {"bool": ["true", "false"], "location": list(LOCATIONS), "category": list(procedural_set().categories)}
    by_type: Dict[str, Counter] = defaultdict(Counter)
    for _, answer, _, rtype, _ in generated[preset]:
        by_type[rtype][answer] += 1
    assert set(by_type) <= set(PRESETS[preset].response_types)
    if preset == "high":
        assert set(by_type) == {"bool", "location", "category"}
    for rtype, counts in by_type.items():
        n = sum(counts.values())
        assert set(counts) == set(spaces[rtype])
        for value in spaces[rtype]:
            share = counts[value] / n
            assert abs(share - 1 / len(spaces[rtype])) <= 0.02, (preset, rtype, value, share)


@pytest.mark.parametrize("preset", ["low", "medium", "high", "single_frame_location", "single_frame_category",
                                    "identify_category", "identify_location"])
def test_presets_hit_their_frame_count(generated, preset):
    assert {row[4] for row in generated[preset]} == {PRESETS[preset].n_frames}


def test_preset_operator_limits():
    stim = procedural_set()
    for name, n_bool, n_switch in (("low", {1}, {0}), ("medium", {1}, {1}), ("high", {1, 2}, {1})):
        sampler = PresetSampler(PRESETS[name], stim)
        seen = set()
        for i in range(300):
            task, tr = sampler.trial(rng_for(1, name, i))
            assert task.n_bool_ops in n_bool and task.n_switch in n_switch
            assert tr.meta["n_and"] + tr.meta["n_or"] == task.n_bool_ops
            text = tr.instruction
            assert text.count(" and ") + text.count(" or ") == task.n_bool_ops
            seen.add(task.n_bool_ops)
        assert seen == n_bool
