"""Reward schemes: every outcome of R3-RAG's scheme with the official constants, the ablation, the registry."""

from __future__ import annotations

import pytest

from r3_env.rewards import (
    BranchHit,
    Episode,
    Outcome,
    R3RewardConfig,
    available_schemes,
    get_scheme,
    is_concise,
    r3_step_rewards,
    top_survivor_config,
    top_survivor_step_rewards,
    top_t_average_precision,
)

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


def test_mean_process_aggregate_stops_paying_for_searching_again():
    """With the paper's sum, a repeated search at the same relevance adds to the reward; with the mean it does not."""
    summed, mean = get_scheme("r3"), get_scheme("r3", process_aggregate="mean")
    once, again = Episode(Outcome.CORRECT, [0.5]), Episode(Outcome.CORRECT, [0.5, 0.5, 0.5])
    assert sum(summed.step_rewards(again)) > sum(summed.step_rewards(once))
    assert mean.step_rewards(once) == pytest.approx([0.8, 2.0])
    assert mean.step_rewards(again) == pytest.approx([0.8 / 3, 0.8 / 3, 0.8 / 3, 2.0])
    # a search that raises the mean still pays; one that lowers it costs
    assert sum(mean.step_rewards(Episode(Outcome.CORRECT, [0.5, 1.0]))) > sum(mean.step_rewards(once))
    assert sum(mean.step_rewards(Episode(Outcome.CORRECT, [0.5, 0.2]))) < sum(mean.step_rewards(once))
    assert mean.step_rewards(Episode(Outcome.FORMAT_ERROR, [0.4, 0.2])) == pytest.approx([0.2, 0.1, -0.9])
    assert mean.step_rewards(Episode(Outcome.CORRECT, [])) == [2.0]
    with pytest.raises(ValueError, match="process_aggregate must be 'sum' or 'mean', got 'max'"):
        get_scheme("r3", process_aggregate="max")


def test_r3_gold_reads_each_steps_relevance_from_the_gold_passages_it_found_first():
    scheme = get_scheme("r3_gold")
    assert scheme.needs_gold and not scheme.needs_relevance and scheme.score == "accuracy"
    # two gold passages: the first search finds one, a search again finds nothing new, the third the other
    found = Episode(Outcome.CORRECT, [0.0, 0.0, 0.0], new_gold=[1, 0, 1], gold_total=2)
    assert scheme.step_rewards(found) == pytest.approx([0.8, 0.0, 0.8, 2.0])
    wrong = Episode(Outcome.WRONG, [0.0, 0.0], new_gold=[1, 0], gold_total=2)
    assert scheme.step_rewards(wrong) == pytest.approx([0.4, 0.0, 0.0])
    # the judged relevance the episode carries is not used
    assert scheme.step_rewards(Episode(Outcome.WRONG, [1.0], new_gold=[0], gold_total=2)) == [0.0, 0.0]
    assert get_scheme("r3_gold", correct_scale=1.0).step_rewards(found) == pytest.approx([0.5, 0.0, 0.5, 2.0])
    with pytest.raises(ValueError, match="r3_gold needs the gold passages of each question"):
        scheme.step_rewards(Episode(Outcome.CORRECT, [0.0]))
    with pytest.raises(ValueError, match="retrieval step found first"):
        scheme.step_rewards(Episode(Outcome.CORRECT, [0.0], gold_total=2))
    with pytest.raises(ValueError, match="without process_rewards it is the outcome scheme"):
        get_scheme("r3_gold", process_rewards=False)


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


# -- top_survivor (docs/recipes/r2ag.md#rewards): R = 0.2 R_MH + 0.3 R_JH + 0.2 R_AP + R_f ---------------

HIT = BranchHit(gold=True, new=True)  # a base query whose top-1 is gold, found for the first time
OLD = BranchHit(gold=True, new=False)  # gold, but in the context or found by an earlier query or step
MISS = BranchHit(gold=False)
P_HIT = BranchHit(gold=True, new=True, predicted=True)
P_OLD = BranchHit(gold=True, new=False, predicted=True)
P_MISS = BranchHit(gold=False, predicted=True)


def expansion(outcome, branches, gold_total, gold_before=0, stopped=False) -> Episode:
    """An episode whose new_gold agrees with its branches (new gold hits per retrieval step)."""
    return Episode(
        outcome,
        [0.0] * len(branches),
        new_gold=[sum(b.gold and b.new for b in step) for step in branches],
        gold_total=gold_total,
        branches=branches,
        gold_before=gold_before,
        stopped=stopped,
    )


NA, ST = Outcome.NO_ANSWER, Outcome.STOPPED


@pytest.mark.parametrize(
    ("episode", "options", "expected"),
    [
        # R_MH: one new gold base hit 0.2; AP_base (1/3)(1/1); R_f one block 0.01
        (expansion(NA, [[HIT]], 3), {}, [0.2 * 1 + 0.2 * (1 / 3) + 0.01]),
        # a predicted hit counts l = 1.25 in R_MH; its AP is the predicted queries' own; two blocks 0.02
        (expansion(NA, [[MISS, P_HIT]], 3), {}, [0.2 * 1.25 + 0.2 * (0 + 1 / 3) + 0.02]),
        (expansion(NA, [[HIT, P_HIT]], 2), {}, [0.2 * (1 + 1.25) + 0.2 * (1 / 2 + 1 / 2) + 0.02]),
        # only NEW gold counts, in R_MH and in AP (a gold document already held is not a hit again):
        # the new hit at rank 2 gives AP (1/3)(1/2)
        (expansion(NA, [[OLD, HIT]], 3, gold_before=1), {}, [0.2 * 1 + 0.2 * (1 / 3) * (1 / 2) + 0.02]),
        (expansion(NA, [[OLD, P_OLD]], 2, gold_before=1), {}, [0.0 + 0.0 + 0.02]),
        # copying a query earns nothing: four queries on the one gold document held score the format bonus only
        (expansion(NA, [[OLD] * 4], 2, gold_before=1), {}, [0.02]),
        # AP over the first t = 4 base results: ranks 2 and 4 are gold, the 5th (gold) is ignored
        (
            expansion(NA, [[MISS, HIT, MISS, HIT, HIT]], 4),
            {},
            [0.2 * 3 + 0.2 * (1 / 4) * (1 / 2 + 2 / 4) + 0.02],
        ),
        # ... and the first t = 2 predicted ones: a gold 3rd predicted result is ignored (its R_MH is not)
        (
            expansion(NA, [[HIT, P_MISS, P_MISS, P_HIT]], 2),
            {},
            [0.2 * (1 + 1.25) + 0.2 * (1 / 2 + 0) + 0.02],
        ),
        # AP's precision@u: (1/3)(1/1 + 2/3) for gold at ranks 1 and 3
        (expansion(NA, [[HIT, MISS, HIT]], 3), {}, [0.2 * 2 + 0.2 * (1 / 3) * (1 + 2 / 3) + 0.02]),
        # R_f: 0.01 per query block, at most 0.02
        (expansion(NA, [[MISS]], 2), {}, [0.01]),
        (expansion(NA, [[MISS, MISS]], 2), {}, [0.02]),
        (expansion(NA, [[MISS] * 4 + [P_MISS] * 2], 2), {}, [0.02]),
        # several steps, no stop (max_steps): each step its own terms, no R_JH, no zeroing
        (
            expansion(NA, [[HIT, MISS], [MISS, P_HIT]], 3),
            {},
            [0.2 + 0.2 * (1 / 3) + 0.02, 0.2 * 1.25 + 0.2 * (1 / 3) + 0.02],
        ),
        # R_JH: stop after queries that complete the gold set (1 in the context + 1 found now)
        (expansion(NA, [[HIT]], 2, gold_before=1, stopped=True), {}, [0.2 + 0.2 * (1 / 2) + 0.01 + 0.3]),
        (
            expansion(NA, [[HIT, MISS], [OLD, P_HIT]], 2, stopped=True),
            {},
            [0.2 + 0.2 * (1 / 2) + 0.02, 0.2 * 1.25 + 0.2 * (0 + 1 / 2) + 0.02 + 0.3],
        ),
        # a stop-only final step (STOPPED): R_JH alone at that step
        (expansion(ST, [[HIT, HIT]], 2), {}, [0.2 * 2 + 0.2 * (1 / 2) * (1 + 2 / 2) + 0.02, 0.3]),
        (expansion(ST, [], 2, gold_before=2), {}, [0.3]),  # the context already held every gold document
        (expansion(ST, [[MISS]], 1, gold_before=1), {}, [0.01, 0.3]),
        # zero: a format error (a missing think block, truncation), whatever came before
        (expansion(Outcome.FORMAT_ERROR, [[HIT, P_HIT]], 2), {}, [0.0, 0.0]),
        (expansion(Outcome.FORMAT_ERROR, [], 2, gold_before=2), {}, [0.0]),
        # zero: stop before every gold document was found (gold_before counts towards "every")
        (expansion(NA, [[HIT]], 2, stopped=True), {}, [0.0]),
        (expansion(NA, [[HIT], [P_HIT]], 3, stopped=True), {}, [0.0, 0.0]),
        (expansion(ST, [[HIT]], 3, gold_before=1), {}, [0.0, 0.0]),
        (expansion(ST, [], 2, gold_before=1), {}, [0.0]),
        # the constants are options
        (expansion(NA, [[HIT]], 3), {"alpha": 1.0}, [1.0 + 0.2 * (1 / 3) + 0.01]),
        (expansion(NA, [[HIT, P_HIT]], 2), {"predicted_weight": 2.0}, [0.2 * 3 + 0.2 * 1.0 + 0.02]),
        (expansion(NA, [[MISS, HIT]], 1), {"survivors_base": 1, "gamma": 1.0}, [0.2 + 0.0 + 0.02]),
        (expansion(NA, [[HIT, P_HIT]], 2), {"survivors_predicted": 0}, [0.2 * 2.25 + 0.2 * 0.5 + 0.02]),
        (expansion(NA, [[MISS] * 3], 2), {"format_bonus": 0.05, "format_cap": 0.1}, [0.1]),
        (expansion(NA, [[MISS]], 2), {"omega": 2.0}, [0.02]),
        (expansion(ST, [], 1, gold_before=1), {"beta": 1.0}, [1.0]),
        (expansion(NA, [[HIT]], 1, stopped=True), {"beta": 0.5, "gamma": 0.0}, [0.2 + 0.01 + 0.5]),
    ],
)
def test_top_survivor_reward_table(episode, options, expected):
    scheme = get_scheme("top_survivor", **options)
    rewards = scheme.step_rewards(episode)
    assert len(rewards) == episode.num_steps
    assert rewards == pytest.approx(expected)
    assert top_survivor_step_rewards(episode, top_survivor_config(**options)) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("hits", "t", "gold_total", "expected"),
    [
        ([True], 4, 1, 1.0),
        ([True, False, True], 4, 2, (1 / 1 + 2 / 3) / 2),
        ([False, True, True, False, True], 4, 3, (1 / 2 + 2 / 3) / 3),  # the 5th result is beyond t
        ([False, True, True, False, True], 5, 3, (1 / 2 + 2 / 3 + 3 / 5) / 3),
        ([True, True], 1, 4, 1 / 4),
        ([], 4, 2, 0.0),
        ([False, False], 2, 2, 0.0),
        ([True, True], 0, 2, 0.0),  # no survivors (survivors_predicted 0)
    ],
)
def test_top_t_average_precision(hits, t, gold_total, expected):
    assert top_t_average_precision(hits, t, gold_total) == pytest.approx(expected)


def test_top_survivor_declares_and_checks_what_it_needs():
    scheme = get_scheme("top_survivor")
    assert scheme.name == "top_survivor" and "top_survivor" in available_schemes()
    assert scheme.needs_gold and not scheme.needs_correctness and not scheme.needs_relevance
    assert not scheme.needs_query_similarity and not scheme.needs_training_step
    assert scheme.score == "reward"  # what dynamic filtering reads: 0 only for broken steps and early stops
    with pytest.raises(ValueError, match="reward scheme 'top_survivor'.*bogus"):
        get_scheme("top_survivor", bogus=1)
    with pytest.raises(ValueError, match="survivors_base must be at least 1"):
        get_scheme("top_survivor", survivors_base=0)
    with pytest.raises(ValueError, match="survivors_predicted"):
        top_survivor_config(survivors_predicted=-1)
    with pytest.raises(ValueError, match="gold_ids"):
        scheme.step_rewards(Episode(Outcome.NO_ANSWER, [0.0], new_gold=[0], branches=[[MISS]]))
    with pytest.raises(ValueError, match="branches has 2 entries for 1 retrieval steps"):
        Episode(Outcome.NO_ANSWER, [0.0], gold_total=2, branches=[[HIT], [HIT]])
    with pytest.raises(ValueError, match="more than gold_total"):
        Episode(Outcome.STOPPED, [], gold_total=2, gold_before=3)
    assert Episode(Outcome.STOPPED).num_steps == 1 and Episode("stopped").outcome is Outcome.STOPPED
    # without branches (another format's episode) a step earns nothing but the Joint-Hit
    assert scheme.step_rewards(Episode(Outcome.STOPPED, [0.0], new_gold=[1], gold_total=1)) == [0.0, 0.3]


def test_other_schemes_treat_a_stop_as_no_answer_given():
    stopped = Episode(Outcome.STOPPED, [0.5], new_gold=[1], gold_total=1)
    assert get_scheme("r3").step_rewards(stopped) == pytest.approx([0.5 * 0.9, 0.0])
    assert get_scheme("gold_hit").step_rewards(stopped) == pytest.approx([0.2, 0.3])
