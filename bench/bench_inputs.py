"""Candidate answers of 1-13 tokens and the 2-image bench sample shared by the model benchmarks
(images: utils.images.noise_image)."""
from __future__ import annotations

from typing import Any, Dict

from reform_eval.utils.images import noise_image

#: candidate answers of varied token lengths (short marks to a full sentence)
CANDIDATE_WORDS = ["yes", "no", "red", "green", "blue square", "a yellow circle on the left", "(A)", "(B) two",
                   "three cats and a dog", "the second image", "none of the above options", "purple star",
                   "left of the triangle", "it is the same colour as the first object in the scene"]


def bench_sample(i: int) -> Dict[str, Any]:
    """Sample ``b<i>``: two seeded 64x48 noise images and a one-line question."""
    return {"sample_id": f"b{i}", "formulation": "SingleChoice", "inference_method": "likelihood",
            "images": [noise_image(10 * i, (64, 48)), noise_image(10 * i + 1, (64, 48))],
            "instruct": "Answer the question.",
            "question": f"Which of the two images shows a red circle? ({i})", "history": []}
