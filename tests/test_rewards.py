"""Reward schemes: every outcome of R3-RAG's scheme with the official constants, the ablation, the registry."""

from __future__ import annotations

import pytest

from r3_env.rewards import Episode, Outcome, R3RewardConfig, available_schemes, get_scheme, r3_step_rewards

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
    with pytest.raises(TypeError):
        get_scheme("r3", no_such_constant=1)
    with pytest.raises(ValueError, match="in \\[0, 1\\]"):
        Episode(Outcome.WRONG, [1.5])
    with pytest.raises(ValueError, match="at least one retrieval step"):
        Episode(Outcome.NO_ANSWER, [])
    with pytest.raises(ValueError):
        Episode("maybe", [])
