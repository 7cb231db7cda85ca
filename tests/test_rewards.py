"""Reward schemes: every outcome of R3-RAG's scheme with the official constants, the ablation, the registry."""

from __future__ import annotations

import pytest

from r3_env.rewards import Episode, Outcome, R3RewardConfig, available_schemes, get_scheme, is_concise, r3_step_rewards

R3 = get_scheme("r3")


@pytest.mark.parametrize(
    ("episode", "expected"),
    [
        # correct: relevance x (1 + 0.6), the answer step 2.0
        (Episode(Outcome.CORRECT, [0.5, 1.0]), [0.8, 1.6, 2.0]),
        (Episode(Outcome.CORRECT, []), [2.0]),  # answered without retrieving
        # wrong: relevance x (1 - 0.2), the answer step 0.0
        (Episode(Outcome.WRONG, [0.5, 1.0]), [0.4, 0.8, 0.0]),
        # no answer within max_steps: relevance x (1 - 0.1), no final step
        (Episode(Outcome.NO_ANSWER, [0.5, 0.2, 1.0]), [0.45, 0.18, 0.9]),
        # format error at step k: earlier steps unscaled, step k gets -(1 - 0.1)
        (Episode(Outcome.FORMAT_ERROR, [0.5, 0.3]), [0.5, 0.3, -0.9]),
        (Episode(Outcome.FORMAT_ERROR, []), [-0.9]),
    ],
)
def test_r3_scheme_with_the_official_constants(episode, expected):
    assert R3.step_rewards(episode) == pytest.approx(expected)
    assert len(expected) == episode.num_steps
    assert R3.needs_relevance


def test_outcome_ablation_drops_only_the_process_rewards():
    scheme = get_scheme("outcome")
    assert not scheme.needs_relevance
    assert scheme.step_rewards(Episode(Outcome.CORRECT, [0.5, 1.0])) == [0.0, 0.0, 2.0]
    assert scheme.step_rewards(Episode(Outcome.FORMAT_ERROR, [0.7])) == pytest.approx([0.0, -0.9])
    assert scheme.step_rewards(Episode(Outcome.NO_ANSWER, [0.7])) == [0.0]


def test_constants_are_configurable():
    scheme = get_scheme("r3", correct_answer_reward=1.0, correct_scale=1.0)
    assert scheme.step_rewards(Episode("correct", [0.5])) == [0.5, 1.0]
    assert r3_step_rewards(Episode(Outcome.WRONG, [1.0]), R3RewardConfig(wrong_scale=0.5)) == [0.5, 0.0]


def test_registry_and_validation():
    assert {"r3", "outcome"} <= set(available_schemes())
    with pytest.raises(ValueError, match="unknown reward scheme 'r4'.*r3"):
        get_scheme("r4")
    with pytest.raises(ValueError, match="reward scheme 'r3'.*no_such_constant"):
        get_scheme("r3", no_such_constant=1)
    with pytest.raises(ValueError, match="in \\[0, 1\\]"):
        Episode(Outcome.WRONG, [1.5])
    with pytest.raises(ValueError, match="at least one retrieval step"):
        Episode(Outcome.NO_ANSWER, [])
    with pytest.raises(ValueError):
        Episode("maybe", [])


CONCISE, VERBOSE = "Marta Kell birthplace", "what is the name of the place where Marta Kell was born?"
TWO = {"relevance": [0.0, 0.0], "queries": ["film director", "director birthplace"], "query_similarity": 0.4}


@pytest.mark.parametrize(
    ("episode", "options", "expected"),
    [
        # stage 1 (step < switch_step 10): correct 1; wrong -1 + 0.3 RC
        (Episode(Outcome.CORRECT, **TWO), {}, 1 - 0.4 + 1),
        (Episode(Outcome.WRONG, **TWO), {}, -1 + 0.6 - 0.4 + 1),
        (Episode(Outcome.CORRECT, [], training_step=9), {}, 1 + 0 + 1),  # no retrieval: no search term
        # stage 2 (from step 10): correct 1 - 0.3 RC; wrong -1
        (Episode(Outcome.CORRECT, **TWO, training_step=10), {}, 1 - 0.6 - 0.4 + 1),
        (Episode(Outcome.WRONG, **TWO, training_step=10), {}, -1 - 0.4 + 1),
        (Episode(Outcome.CORRECT, [0.0], queries=[CONCISE]), {"switch_step": 0}, 1 - 0.3 + 0 + 1),
        # the search term: one concise query 0, one verbose query -1, several: minus their mean cosine
        (Episode(Outcome.CORRECT, [0.0], queries=[VERBOSE]), {}, 1 - 1 + 1),
        (Episode(Outcome.CORRECT, [0.0, 0.0]), {"diversity": False}, 1 + 0 + 1),
        (
            Episode(Outcome.WRONG, [0.0, 0.0, 0.0], queries=["a", "b", "c"], query_similarity=0.9),
            {},
            -1 + 0.9 - 0.9 + 1,
        ),
        # the format term: -1 for a broken step, and for running out of steps (both shapes end in an answer)
        (Episode(Outcome.FORMAT_ERROR, [0.0], queries=[CONCISE]), {}, -1 + 0.3 - 1),
        (Episode(Outcome.FORMAT_ERROR, []), {}, -1 - 1),
        (Episode(Outcome.NO_ANSWER, [0.0], queries=[CONCISE]), {}, -1 + 0.3 - 1),
        (Episode(Outcome.NO_ANSWER, [0.0], queries=[CONCISE], training_step=10), {}, -1 - 1),
        # constants are options
        (Episode(Outcome.WRONG, **TWO), {"beta": 0.5, "format_reward": 0.5}, -1 + 1.0 - 0.4 + 0.5),
    ],
)
def test_lws_reward_table(episode, options, expected):
    scheme = get_scheme("lws", **{"switch_step": 10, **options})
    rewards = scheme.step_rewards(episode)
    assert len(rewards) == episode.num_steps and rewards[:-1] == [0.0] * (episode.num_steps - 1)
    assert rewards[-1] == pytest.approx(expected)


def test_lws_declares_what_it_needs():
    scheme = get_scheme("lws", switch_step=7)
    assert scheme.needs_training_step and scheme.needs_query_similarity and not scheme.needs_relevance
    assert scheme.stage_switch == 7 and get_scheme("r3").stage_switch is None
    assert not get_scheme("lws", diversity=False).needs_query_similarity
    with pytest.raises(ValueError, match="query embeddings"):
        scheme.step_rewards(Episode(Outcome.CORRECT, [0.0, 0.0], queries=["a", "b"]))
    with pytest.raises(ValueError, match="beta and switch_step"):
        get_scheme("lws", beta=-0.1)


@pytest.mark.parametrize(
    ("query", "concise"),
    [
        ("Hestolvale Tower director", True),
        ("birthplace of Marta Kell", True),
        ("Marta Kell", True),
        ("who directed Hestolvale Tower", False),  # a question word
        ("Hestolvale Tower director?", False),  # a question mark
        (" ".join(["word"] * 11), False),  # too long
        ("", False),
        ("the name of the director of the film", False),  # function words
        ("please find information about Marta Kell", False),  # fillers
    ],
)
def test_is_concise_rule(query, concise):
    assert is_concise(query) is concise


def test_gold_hit_rewards_new_gold_and_completion_and_zeroes_early_stops():
    scheme = get_scheme("gold_hit")
    assert scheme.needs_gold and not scheme.needs_relevance and not scheme.needs_correctness
    assert scheme.step_rewards(Episode(Outcome.CORRECT, [0, 0], new_gold=[1, 1], gold_total=2)) == pytest.approx(
        [0.2, 0.2, 0.3]
    )
    assert scheme.step_rewards(Episode(Outcome.WRONG, [0, 0], new_gold=[2, 0], gold_total=2)) == pytest.approx(
        [0.4, 0.0, 0.3]  # correctness is not its business: all gold found, then it stopped
    )
    assert scheme.step_rewards(Episode(Outcome.CORRECT, [0], new_gold=[1], gold_total=2)) == [0.0, 0.0]  # too early
    assert scheme.step_rewards(Episode(Outcome.NO_ANSWER, [0, 0], new_gold=[1, 0], gold_total=2)) == pytest.approx(
        [0.2, 0.0]
    )
    assert scheme.step_rewards(Episode(Outcome.FORMAT_ERROR, [0], new_gold=[1], gold_total=1)) == [0.0, 0.0]
    with pytest.raises(ValueError, match="gold_ids"):
        scheme.step_rewards(Episode(Outcome.CORRECT, [0], new_gold=[0], gold_total=0))
    with pytest.raises(ValueError, match="more than gold_total"):
        Episode(Outcome.CORRECT, [0], new_gold=[3], gold_total=2)
