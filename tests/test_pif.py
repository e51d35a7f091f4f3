"""MMMT-IF checkers and PIF metrics: every checker on positive and negative cases."""
from __future__ import annotations

import math

import pytest

from reform_eval.metrics import evaluate
from reform_eval.metrics.pif import (CATEGORIES, CHECKERS, INSTRUCTION_IDS, INSTRUCTION_TEXTS, bernoulli_ci,
                         check_instruction, check_instructions, count_words, ecdf, find_integers,
                         instruction_id, iqr, pif, pif_metric, pif_n_k, split_instruction_prefix,
                         split_sentences)
from reform_eval.utils.errors import ReformError


def test_instruction_set_shape() -> None:
    assert len(INSTRUCTION_IDS) == 13 and len(CATEGORIES) == 6
    assert sorted(len(v) for v in CATEGORIES.values()) == [2, 2, 2, 2, 2, 3]
    assert set(CHECKERS) == set(INSTRUCTION_IDS)


@pytest.mark.parametrize("text,iid", [
    ("Instruction: Make all the following responses no more than 4 sentences.", "response_length_short"),
    ("make all the following\nresponses at least 5 sentences", "response_length_long"),
    ("Instruction: End every sentence with a exclamation mark (!).", "end_char_exclamation"),
    ("Instruction: End every sentence with an exclamation mark (!).", "end_char_exclamation"),
    ("Instruction: Only use responses to question where each sentence in the response is at most 18 words "
     "in all future responses.", "sentence_length_short"),
    ("Instruction: Only use responses to questions where each sentence in the response is at least 18 "
     "words in all future responses.", "sentence_length_long"),
    ("Instruction: Include at least one even number in the range bigger than 5 in each of your responses.",
     "number_even"),
    ("Instruction: Use the word \u2019per se\u2019 at least once in all future responses.", "favourite_word_per_se"),
    ("number_odd", "number_odd"),
])
def test_instruction_recognition(text: str, iid: str) -> None:
    assert instruction_id(text) == iid


def test_every_canonical_text_is_recognised() -> None:
    for iid, text in INSTRUCTION_TEXTS.items():
        assert instruction_id("Instruction: " + text) == iid


def test_unknown_instruction_text_errors() -> None:
    with pytest.raises(ReformError, match="unknown MMMT-IF instruction"):
        instruction_id("Instruction: Answer in French.")
    with pytest.raises(ReformError):
        split_instruction_prefix("Instruction: Answer in French. What is shown?")
    assert split_instruction_prefix("What is shown?") == (None, "What is shown?")
    iid, q = split_instruction_prefix("Instruction: Start every sentence with the letter (S). What is it?")
    assert (iid, q) == ("start_char_S", "What is it?")


# ---- sentences and words -------------------------------------------------------------------

def test_sentence_splitting_rules() -> None:
    text = ("Dr. Smith saw e.g. birds, i.e. geese. It cost 3.5 dollars! Did J. K. Rowling write it? "
            "He asked \"why?\" Then left.\n"
            "## A heading\n- a bullet point\n2) a numbered item\n---\n**Bold start** ends here.")
    assert split_sentences(text) == [
        "Dr. Smith saw e.g. birds, i.e. geese.", "It cost 3.5 dollars!", "Did J. K. Rowling write it?",
        "He asked \"why?\"", "Then left.", "A heading", "a bullet point", "a numbered item",
        "**Bold start** ends here."]


def test_inline_numbered_list_and_ellipsis() -> None:
    text = "Differences: 1. **Body**: big. 2. **Doors**: two. Well... maybe. Wait... Now."
    assert split_sentences(text) == ["Differences:", "**Body**: big.", "**Doors**: two.", "Well... maybe.",
                                     "Wait...", "Now."]
    assert split_sentences("In the U.S. people vote. Back in the U.S. It rained.") == [
        "In the U.S. people vote.", "Back in the U.S.", "It rained."]
    assert split_sentences("") == [] and split_sentences("  \n***\n") == []


def test_word_counting() -> None:
    assert count_words("A well-known artist's work costs 1,024 dollars - really.") == 8
    assert count_words("per se") == 2
    assert count_words("** - : **") == 0


# ---- numbers ----------------------------------------------------------------------------------

def test_numbers() -> None:
    assert find_integers("1,024 pages, the 8th time, COVID-19 and 10-12 beats") == [1024, 8, 19, 10, 12]
    assert find_integers("3.5 kg, Image7, 1990s, 3D, -7 degrees, 0.25") == [1990, 3, -7]
    assert find_integers("six eight") == []
    assert find_integers("six eight, twenty-one", number_words=True) == [6, 8, 21]


@pytest.mark.parametrize("text,even,odd", [
    ("There were 8 birds.", True, False),
    ("There were 7 birds.", False, True),
    ("Only 4 or 5 birds.", False, False),
    ("About 1,024 birds.", True, False),
    ("The 9th bird.", False, True),
    ("Image7 shows COVID-19 data.", False, True),
    ("Image8 shows 3.5 birds and 6.0 eggs.", False, False),
    ("It was -8 degrees.", False, False),
    ("It was eight degrees.", False, False),
])
def test_number_checkers(text: str, even: bool, odd: bool) -> None:
    assert CHECKERS["number_even"](text) is even
    assert CHECKERS["number_odd"](text) is odd


def test_number_words_option() -> None:
    assert check_instruction("It was eight degrees.", "number_even", number_words=True)
    assert not check_instruction("It was eight degrees.", "number_even")


# ---- the other checkers -----------------------------------------------------------------------

def test_response_length() -> None:
    four = "One. Two. Three. Four."
    five = "One. Two. Three. Four. Five."
    assert CHECKERS["response_length_short"](four) and not CHECKERS["response_length_short"](five)
    assert CHECKERS["response_length_long"](five) and not CHECKERS["response_length_long"](four)
    # abbreviations do not add sentences; list items do
    assert CHECKERS["response_length_short"]("Mr. A met Dr. B, e.g. at 3.5 p.m. today. Fine.")
    assert CHECKERS["response_length_long"]("Items:\n- a\n- b\n- c\n- d")


def test_start_char() -> None:
    assert CHECKERS["start_char_S"]("Sure thing. \"Some\" say so! **Still** true.\n- seen here")
    assert not CHECKERS["start_char_S"]("Sure thing. Then not.")
    assert CHECKERS["start_char_B"]("(Birds) fly. be careful.")
    assert not CHECKERS["start_char_B"]("Birds fly. 8 birds fly.")
    assert CHECKERS["start_char_S"]("## Summary\nSo it goes.")


def test_end_char() -> None:
    assert CHECKERS["end_char_question"]("Is it red? Is it \"blue?\"\n- Or green?")
    assert not CHECKERS["end_char_question"]("Is it red? It is blue.")
    assert not CHECKERS["end_char_question"]("Differences:\n1. Is it red?")
    assert CHECKERS["end_char_exclamation"]("Wow! **Great!**\nYes (really!)")
    assert not CHECKERS["end_char_exclamation"]("Wow! Great?!?")


def test_favourite_words() -> None:
    like = CHECKERS["favourite_word_like"]
    assert like("Birds LIKE water.") and like("\"like\" this")
    assert not like("It is likely so.") and not like("Unlike them.") and not like("like-minded people")
    itself = CHECKERS["favourite_word_itself"]
    assert itself("The tower itself, tall.") and not itself("The towers themselves.")
    per_se = CHECKERS["favourite_word_per_se"]
    assert per_se("Not a castle per se, but a fort.") and per_se("*Per  se* it is fine.")
    assert not per_se("Per second.") and not per_se("per sea") and not per_se("per-se")


def test_sentence_length() -> None:
    short = "This sentence has exactly five. Another short one here."
    eighteen = " ".join(["word"] * 17) + " end."
    nineteen = " ".join(["word"] * 18) + " end."
    assert CHECKERS["sentence_length_short"](short)
    assert CHECKERS["sentence_length_short"](eighteen)
    assert not CHECKERS["sentence_length_short"](nineteen)
    assert CHECKERS["sentence_length_long"](eighteen + " " + nineteen)
    assert not CHECKERS["sentence_length_long"](eighteen + " Short one.")
    # markdown markers and standalone dashes are not words
    assert CHECKERS["sentence_length_long"]("- " + " - ".join(["w"] * 18) + ".")


def test_empty_response_follows_nothing() -> None:
    for resp in ("", "   ", None):
        assert check_instructions(resp, list(INSTRUCTION_IDS)) == [False] * 13
        assert check_instructions(resp, list(INSTRUCTION_IDS), loose=True) == [False] * 13


def test_pif_and_loose() -> None:
    resp = "Sure, here is my answer:\nSome birds like water! So 8 birds swim!"
    ids = ["start_char_S", "end_char_exclamation", "favourite_word_like", "number_even"]
    assert check_instructions(resp, ids) == [True, False, True, True]
    assert pif(resp, ids) == 0.75
    # loose removes the first line ("Sure, here is my answer:")
    assert check_instructions(resp, ids, loose=True) == [True, True, True, True]
    assert pif("anything", []) == 1.0
    assert check_instructions("*So* bold!*", ["end_char_exclamation"], loose=True) == [True]


# ---- corpus metrics -----------------------------------------------------------------------------

def test_statistics_helpers() -> None:
    m, lo, hi = bernoulli_ci([1, 0, 1, 1])
    half = 1.96 * math.sqrt(0.75 * 0.25 / 4)
    assert m == 0.75 and lo == pytest.approx(0.75 - half) and hi == 1.0
    assert pif_n_k([[1, 1, 0.5, 1], [0, 0.5, 1, 0], [1, 1, 1, 1]]) == {1: 1.0, 2: 2 / 3, 3: 2 / 3, 4: 1 / 3}
    assert iqr([0, 0.5, 1, 1]) == pytest.approx(0.625)  # linear: Q1=0.375, Q3=1.0
    assert ecdf([1, 0.5, 1, 0]) == [[0, 0.25], [0.5, 0.5], [1, 1.0]]


def _rec(chat: str, turn: int, instr: list, preds: list) -> dict:
    return {"sample_id": f"{chat}-t{turn:02d}", "benchmark": "MMMT-IF", "formulation": "Generation",
            "meta": {"chat_id": chat, "turn": turn, "instructions": instr},
            "prediction": preds[0], "predictions": preds}


def test_registered_metric_values() -> None:
    good, bad = "So 8 birds swim!", "the birds swim."
    records = [
        _rec("a", 1, ["start_char_S"], [good, good, bad, good]),
        _rec("a", 2, ["start_char_S", "number_even"], [bad, good, good, good]),
        _rec("b", 1, [], [bad, bad, bad, bad]),
    ]
    out = evaluate(records, "Generation", "generation")
    m = out["metrics"]
    assert out["metric"] == "pif"
    assert m["pif"] == pytest.approx((1 + 0 + 1) / 3)
    assert m["pif_by_turn"]["1"]["pif"] == 1.0 and m["pif_by_turn"]["1"]["n"] == 2
    assert m["pif_by_turn"]["2"]["pif"] == 0.0
    assert m["pif_by_num_instructions"] == {"0": {"pif": 1.0, "n": 1}, "1": {"pif": 1.0, "n": 1},
                                            "2": {"pif": 0.0, "n": 1}}
    assert m["pif_by_instruction"]["start_char_S"]["pif_given"] == 0.5
    assert m["pif_by_instruction"]["number_even"]["followed"] == 0.0
    # PIF-4-K: turn a1 has 3 perfect, a2 has 3 perfect, b1 (no instructions) has 4
    assert [m[f"pif_4_{k}"] for k in range(1, 5)] == [1.0, 1.0, 1.0, pytest.approx(1 / 3)]
    # IQRs: a1 [1,1,0,1] -> 0.25; a2 [0,1,1,1] -> 0.25; b1 [1,1,1,1] -> 0
    assert m["pif_iqr_4"] == pytest.approx((0.25 + 0.25 + 0) / 3)
    assert m["num_chats"] == 2 and m["num_turns_without_instructions"] == 1
    assert set(out["tables"]) >= {"MMMT-IF PIF by turn", "MMMT-IF PIF by instruction"}
    assert "| 2 | 1 | 0.000 |" in out["tables"]["MMMT-IF PIF by turn"]
    assert out["per_sample"][1]["followed"] == [False, False]


def test_metric_single_response_and_bad_records() -> None:
    rec = _rec("a", 1, ["end_char_question"], ["Why?"])
    del rec["predictions"]
    m = pif_metric([rec])["metrics"]
    assert m["pif"] == 1.0 and m["num_responses_per_turn"] == 1
    # one response per turn: no consistency to measure, so no PIF-1-1 or PIF-IQR-1 anywhere
    assert not [k for k in m if k.startswith(("pif_1_", "pif_iqr"))]
    assert "PIF-1-1" not in pif_metric([rec])["tables"]["MMMT-IF summary"]
    with pytest.raises(ReformError, match="meta.instructions"):
        pif_metric([{"sample_id": "x", "prediction": "y", "meta": {}}])
    with pytest.raises(ReformError, match="unknown MMMT-IF instruction"):
        pif_metric([_rec("a", 1, ["Answer in French."], ["Oui."])])


# ---- the paper's worked examples (Tables 7-11), with the PIF the paper reports ---------------------

PAPER_EXAMPLES = [
    # Table 8: the human answer the paper scores 0.4 (2/5): no 'like'; sentence 7 has 19 words
    # and starts with 'T'
    ("Both food items in Image1 and Image2 convey different storylines and sentiments within their culinary cultures! Being round and sweet, doughnuts, as depicted in Image1, often symbolize indulgence and reward! Because of their round shape, they can also denote eternity and completeness! By comparison, spaghetti and tomato sauce shown in picture 2, hold deep-rooted symbolism in Italian culture! Being central to many meals, spaghetti symbolizes unity and family cohesion for more than 6 centuries! By making pasta from scratch or preparing a family recipe the second dish speaks to continuity and heritage! The tomato sauce signifies prosperity and abundance, often representative of the lush Italian gardens and the healthy Mediterranean diet! Beyond its flavor, tomato sauce symbolizes prosperity, reflecting Italy's lush gardens, as well as a healthy Mediterranean diet! Both pasta and tomato sauce embody Italy's identity and cultural pride with connection to land, tradition, and family!",
     ["number_even", "sentence_length_short", "start_char_B", "favourite_word_like", "end_char_exclamation"],
     [True, False, False, False, True]),
    # Table 7, turn 15 (Gemini): 0.5 (3/6)
    ("Stage props can enhance the narrative or symbolism of a performance. Simple props, like the bamboo poles in Image 1, become integral to the dance itself. Conversely, the absence of props in Image 2 might emphasize the dancers' movements and stage presence. Such choices reflect deliberate artistic decisions in conveying a performance's message.",
     ["number_even", "end_char_exclamation", "favourite_word_itself", "sentence_length_short",
      "response_length_short", "start_char_S"],
     [False, False, True, True, True, False]),
    # Table 7, turn 1 (Gemini): 1 (1/1) thanks to "10 or 12"
    ('The individuals in Image 1 are performing Tinikling, a traditional Philippine folk dance characterized by rhythmic and fast-paced footwork, often using bamboo poles. Dancers need a lot of agility to avoid getting their feet caught between the poles, especially as the pace increases to 10 or 12 beats per second.', ["number_even"], [True]),
    # Table 10 (Gemini gives up): 0 (0/6)
    ('Sorry, but I cannot fulfill this request. Combining the existing instructions – to end every sentence with a question mark and to begin every sentence with the letter "S" – creates an impossible grammatical structure for a coherent response.',
     ["sentence_length_short", "number_even", "response_length_long", "favourite_word_per_se",
      "end_char_question", "start_char_S"],
     [False, False, False, False, False, False]),
    # Table 9, row 3: 0.5 (1/2)
    ('Swamps are the typical environment in image 1. Spatially, they appear to be clustered together in dense stands. Serving a multitude of purposes, the leaves of the cattail plant have been ingeniously incorporated into diverse aspects of life in various cultures throughout history. Specifically, the leaves are recognized for their strength and pliability, making them ideal for weaving into mats, baskets, and even temporary shelters, providing both comfort and protection from the elements.', ["start_char_S", "sentence_length_long"], [True, False]),
    # Table 11, row 4 (GPT-4o, inline numbered list with markdown): 0 (0/1)
    ("The vehicles in Image 1 and Image 2 exhibit several noticeable design differences: 1. **Body Style** : The vehicle in Image 1 is a larger, open-top car with a soft convertible roof, while the vehicle in Image 2 is a closed coupe with a hard top. 2. **Number of Doors** : Image 1's vehicle appears to be a larger model possibly with more doors, while the car in Image 2 is a 2-door coupe. 3. **Wheel Design** : The wheels on the car in Image 1 are less detailed with a vintage, simple look, but the car in Image 2 has more modern, detailed hubcaps. 4. **Fenders** : The vehicle in Image 1 has separate, rounded fenders distinct from the main body, while the vehicle in Image 2 has integrated fenders that are more streamlined with the body of the car. 5. **Overall Shape** : The car in Image 1 has a higher profile with a more upright design typical of older styles, whereas the vehicle in Image 2 has a more aerodynamic, rounded shape. These design differences highlight the evolution of automotive design over different decades.", ["number_odd"], [False]),
]


@pytest.mark.parametrize("response,ids,expected", PAPER_EXAMPLES)
def test_paper_examples(response: str, ids: list, expected: list) -> None:
    assert check_instructions(response, ids) == expected


# ---- issue 11 §1: the checkers read text the way a person does ----------------------------------

@pytest.mark.parametrize("text,iid", [
    ("I chose the word 'like' on purpose.", "favourite_word_like"),
    ("Here it is: \u2018like\u2019.", "favourite_word_like"),
    ("She said \u201clike\u201d twice.", "favourite_word_like"),
    ("The tower \u2018itself\u2019 is old.", "favourite_word_itself"),
    ("The tower 'itself' is old.", "favourite_word_itself"),
    ("It is not a castle \"per se\".", "favourite_word_per_se"),
    ("It is not a castle 'per se'.", "favourite_word_per_se"),
    ("It is not a castle \u2018per se\u2019.", "favourite_word_per_se"),
    ("It is not a castle per\nse, but a fort.", "favourite_word_per_se"),
    ("The tower _itself_ is old.", "favourite_word_itself"),
    ("I `like` it.", "favourite_word_like"),
])
def test_quoted_words_count(text: str, iid: str) -> None:
    assert check_instruction(text, iid)


@pytest.mark.parametrize("text,iid", [
    ("Birds don'like it.", "favourite_word_like"),       # apostrophe inside a word joins it
    ("A like-minded crowd.", "favourite_word_like"),
    ("It is likely.", "favourite_word_like"),
    ("The towers' shadows.", "favourite_word_itself"),
    ("Not per-se.", "favourite_word_per_se"),
])
def test_words_inside_other_words_do_not_count(text: str, iid: str) -> None:
    assert not check_instruction(text, iid)


def test_numbers_with_units_and_suffixes() -> None:
    assert find_integers("a 8km walk, 35mm film, 20cm tall") == [8, 35, 20]
    assert find_integers("a 12MP camera, 1080p video, 6pm, 1990s, 3D") == [12, 1080, 6, 1990, 3]
    assert find_integers("an 8x10 print") == [8, 10]
    assert find_integers("3.5kg and 2.0m") == []


@pytest.mark.parametrize("text,even,odd", [
    ("The trail is 8km long.", True, False),
    ("Shot on 35mm film.", False, True),
    ("It is 20cm tall.", True, False),
    ("A 17th-century 9mm bolt.", False, True),
    ("Image8 shows a bird.", False, False),
    ("Compare Photo12 with Figure7.", False, False),
    ("Image10 and Picture9 differ.", False, False),
])
def test_number_checkers_units_and_labels(text: str, even: bool, odd: bool) -> None:
    assert check_instruction(text, "number_even") is even
    assert check_instruction(text, "number_odd") is odd


def test_wrapped_lines_are_one_sentence() -> None:
    wrapped = "Sunlight falls on the small bird that sits\non the old stone wall near the water."
    assert split_sentences(wrapped) == [
        "Sunlight falls on the small bird that sits on the old stone wall near the water."]
    assert check_instruction(wrapped, "start_char_S")
    assert check_instruction("Some birds sing\nBecause it is spring.\nSo they fly.", "response_length_short")
    assert split_sentences("Some birds sing\nBecause it is spring.\nSo they fly.") == [
        "Some birds sing Because it is spring.", "So they fly."]
    # the wrapped long sentence has 19 words: not "at most 18", but "at least 18"
    long_wrapped = ("Both of the birds in the first image are standing in shallow water\n"
                    "beside a wooden pier at sunset today.")
    assert check_instruction(long_wrapped, "sentence_length_long")
    assert not check_instruction(long_wrapped, "sentence_length_short")
    # a wrapped question ends with its question mark, not at the break
    assert check_instruction("Is the bird standing\non one leg?", "end_char_question")


def test_line_breaks_that_end_sentences() -> None:
    # list items, headings, blank lines and complete lines end at the break
    assert split_sentences("Colours:\n- red\n- green\n1. blue\n2) white") == [
        "Colours:", "red", "green", "blue", "white"]
    assert split_sentences("## Summary\nThe bird is a stork") == ["Summary", "The bird is a stork"]
    assert split_sentences("**Overview**\nThe bird is a stork") == ["**Overview**", "The bird is a stork"]
    assert split_sentences("The bird is a stork\n\nIt stands") == ["The bird is a stork", "It stands"]
    assert split_sentences("It is a stork.\nIt stands.") == ["It is a stork.", "It stands."]
    assert split_sentences("| a | b |\n| c | d |") == ["| a | b |", "| c | d |"]
    # a wrapped list item continues in lower case
    assert split_sentences("- the bird stands on\n  one leg\n- it sleeps") == [
        "the bird stands on one leg", "it sleeps"]


@pytest.mark.parametrize("text,n", [
    ("The U.S. Navy uses it. It works.", 2),
    ("Birds from the U.K. and the U.S. migrate. They fly far.", 2),
    ("Many birds, e.g. storks, migrate. They fly far.", 2),
    ("Dr. Smith saw it. He left.", 2),
    ("Mr. and Mrs. Brown, i.e. the owners, smiled.", 1),
    ("No. It is a stork.", 2),
    ("Yes. It is a stork.", 2),
    ("No. 5 is the answer.", 1),
    ("No. (It is a stork.)", 2),
    ("No. \"It is a stork.\"", 2),
    ("It is in Washington, D.C. The bird flew there.", 2),
    ("It was made in the U.S.A. by hand.", 1),
    ("Vitamin C. Then more.", 2),
    ("J. K. Rowling wrote it.", 1),
])
def test_abbreviations_and_standalone_answers(text: str, n: int) -> None:
    assert len(split_sentences(text)) == n, split_sentences(text)


def test_unicode_ellipsis_ends_like_three_dots() -> None:
    for dots in ("...", "\u2026"):
        assert split_sentences(f"Wait{dots} Then it flew.") == [f"Wait{dots}", "Then it flew."]
        assert split_sentences(f"Well{dots} maybe.") == [f"Well{dots} maybe."]
    assert check_instruction("So it waits\u2026 Slowly it flies\u2026 Still there!",
                             "response_length_short")
    assert len(split_sentences("A bird\u2026 A stork\u2026 A crane\u2026 An owl\u2026 A duck.")) == 5


@pytest.mark.parametrize("text,expected", [
    ("Key Features\nThe bird has long legs.", ["Key Features", "The bird has long legs."]),
    ("Overview of the Scene\nA stork stands.", ["Overview of the Scene", "A stork stands."]),
    ("The photo shows the\nEiffel Tower at night.", ["The photo shows the Eiffel Tower at night."]),
    ("1. The bird on the left\n   Stands on one leg.\n2. It sleeps.", ["The bird on the left Stands on one leg.",
                                                                   "It sleeps."]),
    ("- Red legs\nThe bird is a stork.", ["Red legs", "The bird is a stork."]),
    ("She has a Ph.D. in biology. It helps.", ["She has a Ph.D. in biology.", "It helps."]),
    ("I saw it go. Birds fly.", ["I saw it go.", "Birds fly."]),
    ("> Storks are tall\n> and white.\n> They fly.", ["Storks are tall and white.", "They fly."]),
    ("> Key Features\n> Storks are tall.", ["Key Features", "Storks are tall."]),
    ("It lands at 5 p.m. Then it sleeps.", ["It lands at 5 p.m.", "Then it sleeps."]),
])
def test_more_line_and_abbreviation_cases(text: str, expected: list) -> None:
    assert split_sentences(text) == expected
