"""Candidate answers of 1-13 tokens shared by the model benchmarks (images: utils.images.noise_image)."""
from __future__ import annotations

#: candidate answers of varied token lengths (short marks to a full sentence)
CANDIDATE_WORDS = ["yes", "no", "red", "green", "blue square", "a yellow circle on the left", "(A)", "(B) two",
                   "three cats and a dog", "the second image", "none of the above options", "purple star",
                   "left of the triangle", "it is the same colour as the first object in the scene"]

