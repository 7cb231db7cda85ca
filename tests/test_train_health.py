"""PPO's health monitor on synthetic iterations: each sign warns when it should and a healthy run stays quiet;
its settings as flags; the report's Health charts, warnings and best policy. (A real collapsing PPO run:
``test_a_collapsing_run_warns_and_keeps_the_best_policy_by_dev_reward`` in test_train.py.)"""

from __future__ import annotations

import argparse
import json
import logging

import pytest

from eval.report_training import training_charts, training_html, training_markdown
from r3_env.config import ConfigError, configs_from_args
from r3_env.data import write_jsonl
from r3_env.train.config import SECTIONS, HealthConfig, ModelConfig, PPOConfig, RunConfig, SFTConfig
from r3_env.train.health import QUERIES_KEY, HealthMonitor, query_shares, read_health, read_warnings


def episode(question: str, *queries: str, blank: int = 0) -> dict:
    """A response as the agent returns it, reduced to what the monitor reads."""
    return {QUERIES_KEY: {"question": question, "queries": list(queries), "blank": blank}}


QUESTION = "Where was the director of Hestolvale Tower born?"
HEALTHY = [
    episode(QUESTION, "director of Hestolvale Tower", "birthplace of Ann Lee"),
    episode(QUESTION, "Hestolvale Tower director"),
]


def iteration(no_answer=0.0, format_error=0.0, kl=0.002, entropy=2.0) -> dict:
    return {"no_answer": no_answer, "format_error": format_error, "kl": kl, "entropy": entropy}


def test_query_shares_count_blank_repeated_and_copied_queries():
    responses = [
        episode(
            QUESTION,
            "Where was the director of Hestolvale Tower born",
            "where was the DIRECTOR of hestolvale tower born?!",
        ),  # fmt: skip
        episode(QUESTION, "director of Hestolvale Tower", "Director of  Hestolvale Tower.", "  ?", blank=1),
        episode(QUESTION, "Where was the director of Hestolvale born"),  # one word dropped: Jaccard 7/8
        {"prompt": "no queries key (an older agent)"},
    ]
    shares = query_shares(responses)
    # 7 attempts: 1 blank format error, "  ?" has no word; of the 5 others 2 repeat an earlier one of their episode
    assert shares["blank_queries"] == pytest.approx(2 / 7)
    assert shares["repeated_queries"] == pytest.approx(2 / 5)
    assert shares["copied_queries"] == pytest.approx(3 / 5)  # the first episode's two and the one-word drop
    assert query_shares(responses, copy_similarity=1.0)["copied_queries"] == pytest.approx(2 / 5)
    assert query_shares(HEALTHY) == {"blank_queries": 0.0, "repeated_queries": 0.0, "copied_queries": 0.0}
    assert query_shares([])["blank_queries"] == 0.0


def test_the_agent_hands_the_queries_to_the_trainer_beside_openrlhfs_keys():
    from r3_env.openrlhf import agent

    assert agent.QUERIES_KEY == QUERIES_KEY
    record = {
        "question": QUESTION,
        "steps": [
            {"kind": "query", "query": "director of Hestolvale Tower", "queries": []},
            {"kind": "query", "query": None, "queries": ["a", "b"]},  # a multi-query step
            {"kind": "format_error", "query": None, "format_error": "empty_query"},
        ],
    }
    assert agent.episode_queries(record) == {
        "question": QUESTION,
        "queries": ["director of Hestolvale Tower", "a", "b"],
        "blank": 1,
    }
    assert agent.episode_queries({}) == {"question": "", "queries": [], "blank": 0}


def test_a_healthy_run_stays_quiet(tmp_path, caplog):
    monitor = HealthMonitor(HealthConfig(), tmp_path / "health.jsonl")
    caplog.set_level(logging.WARNING)
    noise = [0.0, 0.1, 0.05, 0.15, 0.1, 0.2, 0.05, 0.1]  # shares wander below baseline + margin
    for i, share in enumerate(noise, start=1):
        check = monitor.check(i, HEALTHY, iteration(share, share / 2, kl=0.002 * (1 + i % 3), entropy=2.0 - 0.05 * i))
        assert check.warnings == [] and check.values["health_warnings"] == 0.0
        assert check.values["copied_queries"] == 0.0
    monitor.close()
    assert not caplog.records
    rows = read_health(tmp_path / "health.jsonl")
    assert [row["iteration"] for row in rows] == list(range(1, 9))
    assert rows[0]["baselines"] == {} and rows[3]["baselines"]["no_answer"] == pytest.approx(0.05)
    assert read_warnings(tmp_path / "health.jsonl") == []


@pytest.mark.parametrize(
    ("sick", "sign"),
    [
        ({"no_answer": 0.6}, "no_answer rising"),
        ({"format_error": 0.45}, "format_error rising"),
        ({"kl": 0.05}, "kl spike"),
        ({"entropy": 7.0}, "entropy spike"),
        ({"entropy": 0.5}, "entropy collapse"),
    ],
)
def test_each_logged_sign_warns_once_past_its_threshold(tmp_path, caplog, sick, sign):
    monitor = HealthMonitor(HealthConfig(), tmp_path / "health.jsonl")
    caplog.set_level(logging.WARNING, logger="r3_env.train.health")
    for i in range(1, 5):
        assert monitor.check(i, HEALTHY, iteration(0.1, 0.05)).warnings == []
    [warning] = monitor.check(5, HEALTHY, {**iteration(0.1, 0.05), **sick}).warnings
    monitor.close()
    assert warning.sign == sign and warning.iteration == 5 and warning.value == next(iter(sick.values()))
    [record] = caplog.records
    assert record.levelno == logging.WARNING and record.getMessage().startswith("PPO health, iteration 5: ")
    assert f"{warning.metric} " in record.getMessage()
    [kept] = read_warnings(tmp_path / "health.jsonl")
    assert kept["sign"] == sign and kept["message"] == warning.message


def test_query_signs_warn_against_their_baseline_and_its_floor(tmp_path, caplog):
    config = HealthConfig(baseline_iterations=2, share_margin=0.2, share_floor=0.3)
    monitor = HealthMonitor(config, tmp_path / "health.jsonl")
    caplog.set_level(logging.WARNING, logger="r3_env.train.health")
    collapsed = [episode(QUESTION, QUESTION, QUESTION + "?", QUESTION.lower())] + [episode(QUESTION, blank=1)] * 3
    # during the baseline iterations nothing warns, however bad
    assert monitor.check(1, collapsed, iteration()).warnings == []
    assert monitor.check(2, HEALTHY, iteration()).warnings == []
    warnings = monitor.check(3, collapsed, iteration()).warnings
    assert {w.sign for w in warnings} == {"blank_queries rising", "repeated_queries rising", "copied_queries rising"}
    copied = next(w for w in warnings if w.metric == "copied_queries")
    assert copied.value == 1.0 and copied.baseline == pytest.approx(0.5) and copied.threshold == pytest.approx(0.7)
    messages = [r.getMessage() for r in caplog.records]
    assert (
        "PPO health, iteration 3: queries copying the question rising: copied_queries 1.000, baseline 0.500 "
        "(warns above 0.700)" in messages
    )
    # a share above its margin but under the floor does not warn
    quiet = HealthMonitor(HealthConfig(baseline_iterations=1, share_margin=0.05, share_floor=0.5))
    quiet.check(1, HEALTHY, iteration(0.0))
    assert quiet.check(2, HEALTHY, iteration(0.4)).warnings == []
    assert [w.sign for w in quiet.check(3, HEALTHY, iteration(0.5)).warnings] == ["no_answer rising"]


# Retrievals per episode of two logged runs (metrics.jsonl, docs/results.md): the R3 reward summed over steps, 20
# iterations at lr 5e-6, which learned to search again "with different words" until its steps ran out (dev EM 45.5
# to 27.0; the query shares stayed under their floor); and the outcome reward at lr 1e-5, which settled on two.
SEARCHING_AGAIN = [2.5, 2.125, 2.4375, 2.4375, 2.375, 2.0625, 2.75, 2.875, 2.125, 2.75, 2.75, 2.75, 3.0, 3.625,
                   3.1875, 2.8125, 3.5, 2.6875, 3.0625, 2.5625]  # fmt: skip
SETTLED = [2.5625, 2.1875, 1.875, 1.9375, 2.0, 2.4375]


def test_retrievals_per_episode_warn_when_their_recent_mean_drifts_either_way(tmp_path, caplog):
    monitor = HealthMonitor(HealthConfig(), tmp_path / "health.jsonl")
    caplog.set_level(logging.WARNING, logger="r3_env.train.health")
    warned = {}
    for i, searches in enumerate(SEARCHING_AGAIN, start=1):
        warned[i] = monitor.check(i, HEALTHY, {**iteration(), "retrievals": searches}).warnings
    monitor.close()
    # the mean of iterations 12-14 (3.125) is the first past 1.3 x 2.354
    assert [i for i, warnings in warned.items() if warnings] == [14, 15, 16, 17, 19]
    [first] = warned[14]
    assert first.sign == "retrievals rising" and first.value == pytest.approx(3.125)
    assert first.baseline == pytest.approx(7.0625 / 3) and first.threshold == pytest.approx(1.3 * 7.0625 / 3)
    assert caplog.records[0].getMessage() == (
        "PPO health, iteration 14: retrievals per episode rising: retrievals 3.12 over the last 3 iterations, "
        "baseline 2.35 (warns above 3.06)"
    )
    assert [w["iteration"] for w in read_warnings(tmp_path / "health.jsonl")] == [14, 15, 16, 17, 19]

    settled = HealthMonitor(HealthConfig())
    assert all(settled.check(i, HEALTHY, {"retrievals": x}).warnings == [] for i, x in enumerate(SETTLED, start=1))
    # one iteration past the factor warns only when the window is that iteration alone
    spiky = [2.0, 2.0, 2.0, 3.0, 2.0]
    for window, warned_at in ((3, []), (1, [4])):
        monitor = HealthMonitor(HealthConfig(drift_window=window))
        checks = [monitor.check(i, HEALTHY, {"retrievals": x}).warnings for i, x in enumerate(spiky, start=1)]
        assert [i for i, warnings in enumerate(checks, start=1) if warnings] == warned_at
    # falling: a policy that stops searching
    falling = HealthMonitor(HealthConfig(baseline_iterations=2, drift_window=1, drift_factor=2.0))
    signs = [[w.sign for w in falling.check(i, HEALTHY, {"retrievals": x}).warnings]
             for i, x in enumerate([2.0, 2.0, 1.01, 0.99], start=1)]  # fmt: skip
    assert signs == [[], [], [], ["retrievals falling"]]
    # a policy that did not search at the start has no baseline to drift from
    never = HealthMonitor(HealthConfig(baseline_iterations=1))
    assert [never.check(i, HEALTHY, {"retrievals": x}).warnings for i, x in enumerate([0.0, 3.0], start=1)] == [[], []]
    with pytest.raises(ValueError, match="drift_factor must be above 1"):
        HealthConfig(drift_factor=1.0)
    with pytest.raises(ValueError, match="drift_window must be at least 1"):
        HealthConfig(drift_window=0)


def test_kl_near_zero_never_spikes_and_a_missing_value_is_skipped():
    monitor = HealthMonitor(HealthConfig(baseline_iterations=2, kl_floor=0.01))
    for i in range(1, 4):
        assert monitor.check(i, HEALTHY, iteration(kl=0.0)).warnings == []
    assert monitor.check(4, HEALTHY, iteration(kl=0.009)).warnings == []  # 'infinitely' above a median of 0
    assert [w.sign for w in monitor.check(5, HEALTHY, iteration(kl=0.02)).warnings] == ["kl spike"]
    no_entropy = {k: v for k, v in iteration().items() if k != "entropy"}  # a critic-only iteration
    assert monitor.check(6, HEALTHY, no_entropy).warnings == []
    assert len(monitor.history["entropy"]) == 5 and len(monitor.history["kl"]) == 6
    assert monitor.check(7, HEALTHY, {**iteration(), "entropy": float("nan")}).warnings == []


def test_the_monitor_resumes_from_its_state_and_readers_keep_an_iterations_last_line(tmp_path):
    path = tmp_path / "health.jsonl"
    first = HealthMonitor(HealthConfig(baseline_iterations=2), path)
    for i in (1, 2):
        first.check(i, HEALTHY, iteration(0.0))
    state = json.loads(json.dumps(first.state_dict()))  # what the checkpoint keeps
    first.check(3, HEALTHY, iteration(0.9))  # iteration 3, then the run is killed before its checkpoint
    first.close()
    resumed = HealthMonitor(HealthConfig(baseline_iterations=2), path)
    resumed.load_state_dict(state)
    assert resumed.check(3, HEALTHY, iteration(0.1)).warnings == []  # the rerun of iteration 3
    [warning] = resumed.check(4, HEALTHY, iteration(0.8)).warnings
    resumed.close()
    assert warning.baseline == 0.0
    assert [row["iteration"] for row in read_health(path)] == [1, 2, 3, 4]
    assert [w["iteration"] for w in read_warnings(path)] == [4]  # the killed run's iteration-3 warning is gone
    assert len(path.read_text().splitlines()) == 5  # append-only


def test_health_and_best_policy_settings_are_flags_and_resumable(tmp_path, capsys):
    from r3_env.train.cli import add_parser
    from r3_env.train.local import LocalTrainConfig, check_config

    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    args = parser.parse_args(["train", "local", "--model.policy", "p", "--ppo.prompts", "t.jsonl",
                              "--ppo.eval_prompts", "d.jsonl", "--ppo.eval-every", "2", "--health.share_floor", "0.1",
                              "--health.spike_factor", "4"])  # fmt: skip
    config = LocalTrainConfig.from_sections(*configs_from_args(args, SECTIONS))
    assert config.ppo.eval_prompts == "d.jsonl" and config.ppo.eval_every == 2 and config.ppo.eval_questions == 100
    assert config.health == HealthConfig(share_floor=0.1, spike_factor=4.0)
    assert config.with_settings({"health.kl_floor": "0.5"}).health.kl_floor == 0.5
    with pytest.raises(SystemExit):
        parser.parse_args(["train", "local", "--help"])
    shown = capsys.readouterr().out
    assert "--health.copy_similarity" in shown and "--ppo.eval_prompts" in shown and "Jaccard" in shown
    with pytest.raises(ValueError, match="spike_factor must be above 1"):
        HealthConfig(spike_factor=1.0)
    with pytest.raises(ValueError, match="eval_every must be at least 1"):
        PPOConfig(eval_every=0)

    def local(**health) -> LocalTrainConfig:
        return LocalTrainConfig(RunConfig(out=str(tmp_path)), ModelConfig(policy="p"), SFTConfig(), PPOConfig(),
                                config.rollout, HealthConfig(**health))  # fmt: skip

    check_config(tmp_path, local())
    check_config(tmp_path, local(share_floor=0.1))  # when to warn may change on resume
    record = json.loads((tmp_path / "config.json").read_text())
    del record["health"], record["ppo"]["eval_prompts"]  # a run recorded before these settings existed
    (tmp_path / "config.json").write_text(json.dumps(record))
    check_config(tmp_path, local())
    with pytest.raises(ConfigError, match=r"ppo\.eval_every"):
        check_config(tmp_path, dataclasses_replace(local(), eval_every=2))


def dataclasses_replace(config, **ppo):
    import dataclasses

    return dataclasses.replace(config, ppo=dataclasses.replace(config.ppo, **ppo))


def test_the_report_shows_the_health_charts_warnings_and_best_policy(tmp_path):
    run = tmp_path / "run"
    rows = [{"stage": "ppo", "step": 0, "dev_reward": 0.5}]
    rows += [
        {"stage": "ppo", "step": i, "reward": 1.0, "no_answer": share, "format_error": 0.0, "blank_queries": 0.0,
         "repeated_queries": 0.0, "copied_queries": float(i > 3), "kl": 0.01, "entropy": 2.0, "dev_reward": 2.0 - share,
         "retrievals": 2.0 + 2 * (i == 5)}
        for i, share in enumerate([0.0, 0.0, 0.1, 0.6, 0.9], start=1)
    ]  # fmt: skip
    write_jsonl(run / "metrics.jsonl", rows)
    monitor = HealthMonitor(HealthConfig(baseline_iterations=2), run / "ppo" / "health.jsonl")
    for row in rows[1:]:  # the queries copy the question from iteration 4 on
        monitor.check(row["step"], [episode(QUESTION, QUESTION if row["step"] > 3 else "Ann Lee")], row)
    monitor.close()
    (run / "ppo" / "best_policy").mkdir(parents=True)
    (run / "ppo" / "best_policy" / "best.json").write_text(json.dumps({"iteration": 1, "dev_reward": 2.0}))

    charts = training_charts(run)
    groups = {chart["title"]: chart["group"] for chart in charts}
    assert groups["Mean episode reward"] == "training" and groups["Dev-set reward (greedy episodes)"] == "training"
    assert [title for title, group in groups.items() if group == "health"] == [
        "Unanswered episodes and format errors",
        "Blank, repeated and copied queries",
        "Retrievals per episode (RC)",
        "KL to the reference policy",
        "Policy entropy",
    ]
    dev = next(chart for chart in charts if chart["title"].startswith("Dev-set"))
    assert dev["series"]["dev reward"][0] == [0, 0.5] and dev["best"] == {"iteration": 1, "dev_reward": 2.0}
    assert dev["markers"] == [{"x": 1, "label": "best policy"}]
    answered = next(chart for chart in charts if chart["title"] == "Unanswered episodes and format errors")
    assert [(w["iteration"], w["sign"]) for w in answered["warnings"]] == [(4, "no_answer rising"),
                                                                            (5, "no_answer rising")]  # fmt: skip

    markdown = training_markdown(charts)
    assert "Best policy (ppo/best_policy): PPO iteration 1, dev reward 2." in markdown
    assert "| 4 | no_answer rising | unanswered episodes | 60.0% | 0.0% | 30.0% |" in markdown
    assert "| 5 | copied_queries rising | queries copying the question | 100.0% | 0.0% | 30.0% |" in markdown
    assert "| 5 | retrievals rising | retrievals per episode | 2.667 | 2 | 2.6 |" in markdown  # (2 + 2 + 4) / 3
    page = training_html(charts)
    assert page.count("<figure") == len(charts) and 'id="stage-switch"' not in page  # a best marker is no switch
    assert 'id="best-policy"' in page and "PPO iteration 1, dev reward 2" in page
    assert page.count("<tr>") == 1 + 5  # the header, then 2 signs at iteration 4 and 3 at iteration 5

    quiet = tmp_path / "quiet"
    write_jsonl(quiet / "metrics.jsonl", [{"stage": "ppo", "step": 1, "no_answer": 0.0}])
    assert "No warnings" in training_markdown(training_charts(quiet))[-1]
    assert "No health warnings" in training_html(training_charts(quiet))
