"""Answer normalisation and metrics: hand-checked values and identity with FlashRAG's own functions."""

from __future__ import annotations

import json
import random

import pytest
from conftest import SHARED_DATA, SHARED_DATASETS
from flashrag.evaluator.metrics import ExactMatch, F1_Score, Sub_ExactMatch
from flashrag.evaluator.utils import normalize_answer as flashrag_normalize
from hypothesis import given, settings
from hypothesis import strategies as st

from r3_env.answers import (
    answer_form,
    answer_matches,
    clean_answer,
    exact_match,
    f1_score,
    normalize_answer,
    sub_exact_match,
    token_scores,
)
from r3_env.world import World
from r3_env.world.questions import QuestionMaker

FLASHRAG_CONFIG = {"dataset_name": "hotpotqa"}
FR_EM, FR_F1, FR_ACC = ExactMatch(FLASHRAG_CONFIG), F1_Score(FLASHRAG_CONFIG), Sub_ExactMatch(FLASHRAG_CONFIG)


def test_normalisation():
    assert normalize_answer("The  Eiffel Tower!") == "eiffel tower"
    assert normalize_answer("An apple, a day") == "apple day"
    assert normalize_answer("Theatre") == "theatre"  # articles only as whole words
    assert normalize_answer("U.S.A.") == "usa"
    assert normalize_answer("  ") == ""


@pytest.mark.parametrize(
    ("prediction", "golds", "em", "f1", "acc"),
    [
        ("Paris", ["paris"], 1.0, 1.0, 1.0),
        ("the city of Paris", ["Paris"], 0.0, 2 * (1 / 3) * 1 / (1 / 3 + 1), 1.0),
        ("Paris, France", ["France", "Paris"], 0.0, 2 * 0.5 * 1 / 1.5, 1.0),
        ("London", ["Paris"], 0.0, 0.0, 0.0),
        ("yes", ["no"], 0.0, 0.0, 0.0),
        ("no", ["no"], 1.0, 1.0, 1.0),
        ("no way", ["no"], 0.0, 0.0, 1.0),  # a yes/no gold scores F1 only against the same bare answer
        ("no way", ["no way out"], 0.0, 2 * 1.0 * (2 / 3) / (1 + 2 / 3), 0.0),
        ("not known", ["no"], 0.0, 0.0, 1.0),  # FlashRAG's acc is a character substring test
        ("", ["Paris"], 0.0, 0.0, 0.0),
        ("12 March 1921", ["March 12, 1921", "12 March 1921"], 1.0, 1.0, 1.0),
    ],
)
def test_hand_checked_values(prediction, golds, em, f1, acc):
    assert exact_match(prediction, golds) == em
    assert f1_score(prediction, golds) == pytest.approx(f1)
    assert sub_exact_match(prediction, golds) == acc


def test_precision_and_recall_are_separate_maxima():
    scores = token_scores("w x y z", ["x", "w x y z e f g h"])
    assert scores["precision"] == 1.0  # from the long gold
    assert scores["recall"] == 1.0  # from the short gold
    assert scores["f1"] == pytest.approx(2 * 1.0 * 0.5 / 1.5)


def test_answer_matches_whole_words_only():
    assert answer_matches("It was directed by Marta Kell.", ["Marta Kell"])
    assert answer_matches("Paris", "paris")
    assert not answer_matches("not known", ["no"])
    assert not answer_matches("Kellner", ["Kell"])
    assert not answer_matches("", ["x"])
    assert not answer_matches("anything", [""])


@pytest.mark.parametrize(
    ("text", "short"),
    [
        ("Paris", "Paris"),
        ("Paris.", "Paris"),
        ("**Paris**", "Paris"),
        ('"The Silent Harbor"', "The Silent Harbor"),
        ("The answer is Marta Kell.", "Marta Kell"),
        ("So, the final answer is: yes", "yes"),
        ("Answer: 1921\nBecause the passage says so.", "1921"),
        ("Washington D.C.", "Washington D.C."),
        ("Inc...", "Inc..."),
        ("", ""),
    ],
)
def test_clean_answer(text, short):
    assert clean_answer(text) == short


@pytest.mark.parametrize(
    ("question", "golds", "form"),
    [
        ("Who was born later, Tamsin Valising or Radek Stavodorf?", ["Tamsin Valising"], "closed"),
        ("Were Scott Derrickson and Ed Wood of the same nationality?", ["Yes"], "closed"),
        ("Who was the father of the father of Cedric Wenendorf?", ["Niklas Wenendorf"], "open"),
        ("Which is older, the Met or the Tate Modern?", ["Tate Modern"], "closed"),  # normalised: no article
        ("Who founded Albertville or Bern?", ["Albert"], "open"),  # whole words only
        # named, but no choice offered: the answer is a namesake
        ("Who is the paternal grandfather of Anton Fredrik Klaveness?", ["Anton Fredrik Klaveness"], "open"),
        # aliases do not count: "in" is in nearly every question
        ("Which country was Barawal in when India was formed?", ["the country of India", "IN", "in"], "open"),
        ("Anything?", [], "open"),
    ],
)
def test_answer_form(question, golds, form):
    assert answer_form(question, golds) == form


def test_answer_form_closes_the_worlds_comparisons_only():
    maker = QuestionMaker(World(200, seed=1), random.Random(2))
    for question_type, form in [("comparison", "closed"), ("bridge_comparison", "closed"),
                                ("compositional", "open"), ("inference", "open")]:  # fmt: skip
        questions = [q for q in (maker.sample(question_type) for _ in range(20)) if q is not None]
        assert questions and {answer_form(q.text, q.answers) for q in questions} == {form}, question_type


# -- identity with FlashRAG -----------------------------------------------------------------------------


def _perturb(answer: str, rng: random.Random) -> str:
    words = answer.split()
    choice = rng.randrange(9)
    if choice == 0:
        return answer.upper()
    if choice == 1:
        return f"The {answer}."
    if choice == 2:
        return f"It is {answer}, I think"
    if choice == 3 and len(words) > 1:
        return " ".join(words[:-1])
    if choice == 4:
        return answer + " " + rng.choice(["and more", "Jr.", "(film)", "yes"])
    if choice == 5:
        return rng.choice(["yes", "no", "noanswer", "No.", "Yes!"])
    if choice == 6:
        return "".join(c for c in answer if c not in ",.-")
    if choice == 7:
        return " ".join(reversed(words))
    return answer


def _metric_inputs() -> list[tuple[str, list[str]]]:
    """A few hundred (prediction, golden answers) pairs: world answers and real dataset answers, perturbed."""
    world = World(400, seed=3)
    maker = QuestionMaker(world, random.Random(5))
    golds: list[list[str]] = []
    while len(golds) < 250:
        question = maker.sample(maker.rng.choice(["compositional", "comparison", "inference", "bridge_comparison"]))
        if question is not None:
            golds.append(question.answers)
    for name in SHARED_DATASETS:
        path = SHARED_DATA / name / "dev.jsonl"
        if path.is_file():
            golds += [json.loads(line)["golden_answers"] for line in path.read_text().splitlines()[:100]]
    rng = random.Random(11)
    pairs = [(_perturb(rng.choice(g), rng), g) for g in golds]
    pairs += [(rng.choice(golds[rng.randrange(len(golds))]), g) for g in golds[:50]]  # mostly wrong answers
    return pairs


def test_metrics_equal_flashrag_on_hundreds_of_inputs():
    pairs = _metric_inputs()
    assert len(pairs) >= 300
    em_hits = 0
    for prediction, golds in pairs:
        assert normalize_answer(prediction) == flashrag_normalize(prediction)
        assert exact_match(prediction, golds) == FR_EM.calculate_em(prediction, golds)
        assert sub_exact_match(prediction, golds) == FR_ACC.calculate_sub_em(prediction, golds)
        assert token_scores(prediction, golds) == pytest.approx(FR_F1.token_level_scores(prediction, golds))
        em_hits += exact_match(prediction, golds) == 1.0
    assert 0.1 < em_hits / len(pairs) < 0.9  # the inputs exercise both outcomes


words = st.sampled_from(["the", "a", "an", "Paris", "yes", "no", "noanswer", "Kell", "1921", "U.S.", "film", "", " "])
phrases = st.lists(st.one_of(words, st.text(max_size=6)), max_size=6).map(" ".join)


@settings(max_examples=300, deadline=None)
@given(phrases, st.lists(phrases, min_size=1, max_size=3))
def test_metrics_equal_flashrag_property(prediction, golds):
    assert exact_match(prediction, golds) == FR_EM.calculate_em(prediction, golds)
    assert sub_exact_match(prediction, golds) == FR_ACC.calculate_sub_em(prediction, golds)
    assert token_scores(prediction, golds) == pytest.approx(FR_F1.token_level_scores(prediction, golds))
