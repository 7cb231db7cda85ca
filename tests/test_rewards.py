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


def test_staged_rc_follows_the_stage_and_the_retrieval_count():
    scheme = get_scheme("staged_rc", switch_step=10)
    two = {"relevance": [0.0, 0.0], "queries": ["film director", "director birthplace"], "query_similarity": 0.4}
    # stage 1: wrong answers earn 0.3 per retrieval; two queries cost their mean similarity; +1 format
    assert scheme.step_rewards(Episode(Outcome.WRONG, **two)) == pytest.approx([0, 0, -1 + 0.6 - 0.4 + 1])
    assert scheme.step_rewards(Episode(Outcome.CORRECT, **two)) == pytest.approx([0, 0, 1 - 0.4 + 1])
    # stage 2: correct answers pay 0.3 per retrieval, wrong ones get -1 flat
    late = {**two, "training_step": 10}
    assert scheme.step_rewards(Episode(Outcome.CORRECT, **late)) == pytest.approx([0, 0, 1 - 0.6 - 0.4 + 1])
    assert scheme.step_rewards(Episode(Outcome.WRONG, **late)) == pytest.approx([0, 0, -1 - 0.4 + 1])
    # one verbose query costs 1; a format failure flips the format term; no answer is wrong, at its last step
    verbose = Episode(Outcome.CORRECT, [0.0], queries=["what is the name of the director of the film?"])
    assert scheme.step_rewards(verbose) == pytest.approx([0, 1 - 1 + 1])
    assert scheme.step_rewards(Episode(Outcome.FORMAT_ERROR, [0.0], queries=["director"])) == pytest.approx(
        [0, -1 + 0.3 - 1]
    )
    assert scheme.step_rewards(Episode(Outcome.NO_ANSWER, [0.0], queries=["director"])) == pytest.approx([-1 + 0.3 + 1])
    with pytest.raises(ValueError, match="query embeddings"):
        scheme.step_rewards(Episode(Outcome.CORRECT, [0.0, 0.0], queries=["a", "b"]))
    assert get_scheme("staged_rc", diversity=False).step_rewards(Episode(Outcome.CORRECT, [0.0, 0.0])) == [0, 0, 2.0]


def test_is_concise_rule():
    assert is_concise("Hestolvale Tower director")
    assert not is_concise("who directed Hestolvale Tower")
    assert not is_concise("Hestolvale Tower director?")
    assert not is_concise(" ".join(["word"] * 11))
    assert not is_concise("")


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
