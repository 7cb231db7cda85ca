"""bench/rl_gain.py and its tables (bench/rl_gain_results.py): the paired bootstrap and the table it reports, and
(slow) every arm on a quick demo."""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import ROOT, run_r3rag

sys.path.insert(0, str(ROOT / "bench"))

from rl_gain import RLGain, evaluation_run_prefix, sft_passes
from rl_gain_results import (
    build_table,
    comparison_rows,
    format_table,
    format_training_search,
    format_versus_bm25,
    read_other_arm,
    training_search,
)

from eval.compare import paired_bootstrap, seeded_paired_bootstrap
from r3_env.answers import answer_form
from r3_env.data import iter_jsonl
from r3_env.train.models import CHECKPOINT_FILE, DONE_FILE

ARMS = ("sft", "sft_more", "rl_process", "rl_outcome", "rl_gold", "rft")
SCHEMES = {"rl_process": "r3", "rl_outcome": "outcome", "rl_gold": "r3_gold"}


def test_identical_arms_differ_by_exactly_zero():
    scores = [0.0, 1.0, 1.0, 0.0, 0.5, 0.25]
    assert paired_bootstrap(scores, scores) == {"mean": 0.0, "lo": 0.0, "hi": 0.0, "n": 6}


def test_a_constant_shift_has_that_shift_as_its_whole_ci():
    base = [0.0, 0.5, 0.2, 0.9, 0.1]
    ci = paired_bootstrap([b + 1.0 for b in base], base)
    assert ci["n"] == 5 and ci["mean"] == pytest.approx(1.0)
    assert ci["lo"] == pytest.approx(1.0) and ci["hi"] == pytest.approx(1.0)
    assert ci["lo"] <= ci["mean"] <= ci["hi"]


def test_the_ci_is_paired_fixed_by_its_seed_and_covers_the_mean():
    base = [float(i % 2) for i in range(40)]
    arm = [float(i % 3 == 0) for i in range(40)]
    ci = paired_bootstrap(arm, base, resamples=500, seed=3)
    assert ci == paired_bootstrap(arm, base, resamples=500, seed=3)
    assert ci["lo"] < ci["mean"] < ci["hi"] and ci["mean"] == pytest.approx(sum(arm) / 40 - sum(base) / 40)
    # pairing: the same per-question shift of a noisy base is certain, whatever the base's spread
    shifted = paired_bootstrap([b + 0.1 for b in base], base)
    assert shifted["hi"] - shifted["lo"] == pytest.approx(0.0, abs=1e-12)
    with pytest.raises(ValueError, match="differ in length"):
        paired_bootstrap([1.0], [1.0, 0.0])


def test_the_seeded_ci_carries_the_spread_between_seeds_and_is_the_question_ci_for_one_seed():
    base = [float(i % 2) for i in range(60)]
    arm = [float(i % 3 == 0) for i in range(60)]
    # one seed each: the question bootstrap, as eval.compare computed it before seeds were resampled
    question_only = {"mean": -1 / 6, "lo": -1 / 3, "hi": 0.0, "n": 60}
    assert seeded_paired_bootstrap([arm], [base], 500, 3) == pytest.approx(question_only)
    assert paired_bootstrap(arm, base, 500, 3) == pytest.approx(question_only)
    # seeds that agree add nothing to the question bootstrap, in either arm
    assert seeded_paired_bootstrap([arm, arm, arm], [base, base], 500, 3) == pytest.approx(question_only)
    # seeds 0.4 apart on every question: averaging them first would hide that spread, resampling them shows it
    low, high = [0.3 * a for a in arm], [0.3 * a + 0.4 for a in arm]
    hidden = paired_bootstrap([(x + y) / 2 for x, y in zip(low, high, strict=True)], base, 500, 3)
    shown = seeded_paired_bootstrap([low, high], [base], 500, 3)
    assert shown["mean"] == pytest.approx(hidden["mean"]) and shown["n"] == 60
    assert shown["hi"] - shown["lo"] > (hidden["hi"] - hidden["lo"]) + 0.2
    # the base's seeds are resampled too
    from_base = seeded_paired_bootstrap([base], [low, high], 500, 3)
    assert from_base["hi"] - from_base["lo"] > (hidden["hi"] - hidden["lo"]) + 0.2
    with pytest.raises(ValueError, match="differ in length"):
        seeded_paired_bootstrap([arm], [base[:10]])
    with pytest.raises(ValueError, match="one list of per-question scores per seed"):
        seeded_paired_bootstrap(arm, [base])  # type: ignore[arg-type]


def _scores(em: float, docs: float = 2.0, full_recall: float | None = 1.0) -> dict:
    return {"em": em, "f1": em, "full_recall": full_recall, "docs": docs, "answered": 1.0, "format_error": 0.0}


def test_the_table_averages_seeds_per_question_and_groups_by_dataset_type_and_answer_form():
    questions = {"a/1": {"dataset": "a", "type": "x", "form": "closed"},
                 "a/2": {"dataset": "a", "type": "y", "form": "open"},
                 "b/1": {"dataset": "b", "type": "x", "form": "open"}}  # fmt: skip
    sft = [{key: _scores(0.0) for key in questions}]
    rl = [{key: _scores(1.0) for key in questions}, {key: _scores(0.0) for key in questions}]  # two seeds
    bm25 = [{key: {**_scores(0.0, 3.0), "em": None, "f1": None} for key in questions}]
    rows = build_table({"sft": sft, "rl_process": rl, "bm25": bm25}, questions, resamples=200)
    groups = list(dict.fromkeys(row["group"] for row in rows))
    # b has one type and one answer form: no rows for them
    assert groups == ["all", "a", "a / x", "a / y", "a / closed answers", "a / open answers", "b"]
    by = {(row["group"], row["arm"]): row for row in rows}
    assert by[("all", "rl_process")]["seeds"] == 2 and by[("all", "rl_process")]["questions"] == 3
    assert by[("all", "rl_process")]["mean"]["em"] == 0.5  # each question's seeds averaged first
    # the CI resamples the seeds too: one seed always right and one always wrong span the whole range
    assert by[("all", "rl_process")]["diff"]["em"] == {"mean": 0.5, "lo": 0.0, "hi": 1.0, "n": 3}
    assert by[("all", "sft")]["diff"]["em"] == {"mean": 0.0, "lo": 0.0, "hi": 0.0, "n": 3}
    assert "em" not in by[("all", "bm25")]["diff"] and by[("all", "bm25")]["diff"]["docs"]["mean"] == 1.0
    text = format_table(rows, "a note")
    assert "### a / x" in text and "| rl_process | 2 | 3 | 50.0 | +50.0 [+0.0, +100.0] |" in text
    assert text.rstrip().endswith("a note")
    assert [row["questions"] for row in rows if row["group"] == "a / closed answers"] == [1, 1, 1]


def test_the_control_table_takes_each_trained_arm_minus_sft_more_per_answer_form():
    questions = {"a/1": {"dataset": "a", "type": "x", "form": "open"},
                 "a/2": {"dataset": "a", "type": "y", "form": "closed"}}  # fmt: skip
    more = [{"a/1": _scores(1.0), "a/2": _scores(0.0)}]
    rl = [{key: _scores(1.0) for key in questions}]
    rows = comparison_rows({"sft_more": more, "rl_gold": rl}, questions, resamples=200, base="sft_more")
    # per dataset and answer form, not per type, without the base
    assert [(row["group"], row["arm"]) for row in rows] == [
        ("a", "rl_gold"), ("a / closed answers", "rl_gold"), ("a / open answers", "rl_gold")]  # fmt: skip
    by = {row["group"]: row for row in rows}
    assert by["a / closed answers"]["diff"]["em"]["mean"] == 1.0 and by["a / open answers"]["diff"]["em"]["mean"] == 0
    by = {row["arm"]: row for row in rows if row["group"] == "a"}
    assert by["rl_gold"]["diff"]["em"]["mean"] == 0.5
    text = format_table([by["rl_gold"]], base="sft_more")
    assert "### a against sft_more" in text and "ΔEM vs sft_more [95% CI]" in text
    assert "| rl_gold | 1 | 2 | 100.0 | +50.0 [" in text


def test_each_rl_run_is_set_beside_bm25_at_its_own_documents_and_a_run_below_it_is_flagged():
    checks = {"rl_gold": {"seed 2": {
        "hotpotqa": {"k": 6, "full_recall": 0.576, "bm25_full_recall": 0.606, "bm25_own_full_recall": 0.566},
        "2wiki": {"k": 6, "full_recall": 0.358, "bm25_full_recall": 0.301, "bm25_own_full_recall": 0.36}}}}  # fmt: skip
    table = format_versus_bm25(checks)
    assert "| run | hotpotqa | 2wiki |" in table
    assert ("| rl_gold, seed 2 | 57.6 vs 60.6 at K = 6 (-3.0, below); vs 56.6 per question (+1.0) | "
            "35.8 vs 30.1 at K = 6 (+5.7); vs 36.0 per question (-0.2, below) |") in table  # fmt: skip
    assert format_versus_bm25({}) == ""  # no RL arm: no table


def test_bm25_at_each_questions_own_documents_averages_over_the_seeds():
    """Per question, BM25 at the documents each seed's episode read (one run per K, none at 0); the bench's BM25
    runs are replaced by a rule (recall only from K = 3), since only the matching is under test here."""
    asked: list[dict[str, int]] = []

    def bm25_scores(ks: dict[str, int], reader: bool = True) -> dict[str, dict[str, float]]:
        assert not reader  # retrieval only: the reader's EM is not compared here
        asked.append(ks)
        return {"a/1": {"full_recall": float(ks["a"] >= 3)}, "a/2": {"full_recall": 1.0}}

    bench = SimpleNamespace(questions={"a/1": {"dataset": "a"}, "a/2": {"dataset": "a"}, "a/3": {"dataset": "a"}},
                            data=SimpleNamespace(eval="data/a/eval.jsonl"), bm25_scores=bm25_scores)  # fmt: skip

    def read(docs: int, recall: float | None = 1.0) -> dict[str, float | None]:
        return {"docs": docs, "full_recall": recall}

    per_seed = [{"a/1": read(2), "a/2": read(0), "a/3": read(4, None)}, {"a/1": read(3), "a/2": read(2)}]
    # a/3 names no gold passage (its own Full-Recall undefined): left out, and K = 4 is never run
    assert RLGain.bm25_at_own_documents(bench, per_seed) == {"a/1": 0.5, "a/2": 0.5}
    assert asked == [{"a": 2}, {"a": 3}]


def test_what_searching_paid_is_read_from_a_seeds_training_episodes(tmp_path):
    """Per RL seed, from its trajectory log: the share that searched in each half, the episodes whose searches found
    a gold passage their start lacked, and the mean reward with and without a search."""
    answer, found, empty = {"kind": "answer"}, {"kind": "query", "new_gold": 1}, {"kind": "query", "new_gold": 0}
    episodes = [
        {"outcome": "correct", "step_rewards": [2.0], "steps": [answer], "num_docs": 4},
        {"outcome": "wrong", "step_rewards": [0.0, 0.0], "steps": [empty, answer], "num_docs": 6},
        {"outcome": "wrong", "step_rewards": [0.0], "steps": [answer], "num_docs": 4},
        {"outcome": "correct", "step_rewards": [2.0, 4.0], "steps": [found, answer], "num_docs": 6},
    ]
    folder = tmp_path / "rl_gold" / "seed0"
    (folder / "train").mkdir(parents=True)
    (folder / "train" / "trajectories.jsonl").write_text("".join(json.dumps(row) + "\n" for row in episodes))
    summary = training_search(folder)
    assert summary["all"]["searched"] == 0.5 and summary["all"]["found_gold"] == 0.25
    assert summary["all"]["reward_searched"] == 3.0 and summary["all"]["reward_not_searched"] == 1.0
    table = format_training_search({"rl_gold, seed 0": summary})
    assert "| rl_gold, seed 0 | 4 | 50 -> 50 | 1 (25.0) | 3.00 | 1.00 |" in table
    assert training_search(tmp_path / "rl_gold" / "seed1") is None  # a run that kept no log
    assert format_training_search({}) == ""
    # a crashed run (steps 0 and 1) resumed from its step-1 checkpoint: the redone step's episodes count once
    crashed = [{**row, "training_step": step, "run": "a"} for row, step in zip(episodes, (0, 0, 1, 1), strict=True)]
    redone = [{**row, "training_step": 1, "run": "b"} for row in episodes[2:]]
    with (folder / "train" / "trajectories.jsonl").open("w") as handle:
        handle.writelines(json.dumps(row) + "\n" for row in crashed + redone)
    assert training_search(folder)["all"] == summary["all"]


def test_another_benchs_arm_is_read_with_its_seeds_and_refused_off_this_demo_or_its_questions(tmp_path):
    """--against: an arm folder of another OUT on the same demo, one result.json or one per seed, on the
    same questions; each way it can differ is refused, naming the file."""
    questions = {"a/1": {"dataset": "a", "type": "x"}, "a/2": {"dataset": "a", "type": "x"}}
    demo, first = tmp_path / "demo", tmp_path / "rl_gain_first"

    def save(folder: Path, em: float, settings: dict, keys=(*questions, "a/3")) -> None:
        folder.mkdir(parents=True)
        scores = {key: _scores(em) for key in keys}
        (folder / "result.json").write_text(json.dumps({"scores": scores, "settings": settings}))

    save(first / "sft", 0.0, {"start": "p"})
    save(first / "rl_gold" / "seed0", 0.0, {"start": "p", "seed": 0})
    save(first / "rl_gold" / "seed1", 1.0, {"start": "p", "seed": 1})
    with pytest.raises(ValueError, match="no bench summary .*rl_gain.json naming its demo"):
        read_other_arm(first / "sft", questions, demo)
    (first / "rl_gain.json").write_text(json.dumps({"demo": str(tmp_path / "another_demo")}))
    with pytest.raises(ValueError, match="that bench ran on the demo .*another_demo, not"):
        read_other_arm(first / "sft", questions, demo)
    (first / "rl_gain.json").write_text(json.dumps({"demo": str(demo)}))
    other = read_other_arm(first / "sft", questions, demo)
    assert other.label == "rl_gain_first/sft" and len(other.scores) == 1 and other.rules_differ == [{}]
    assert not other.is_rl
    other = read_other_arm(first / "rl_gold", questions, demo)
    assert other.label == "rl_gain_first/rl_gold" and [seed["a/1"]["em"] for seed in other.scores] == [0.0, 1.0]
    assert other.seeds == [0, 1] and other.is_rl  # these results name no seed: their folders do
    save(first / "rl_sparse" / "seed10", 0.0, {"start": "p"})
    save(first / "rl_sparse" / "seed2", 0.0, {"start": "p"})
    assert read_other_arm(first / "rl_sparse", questions, demo).seeds == [10, 2]  # read in text order
    with pytest.raises(ValueError, match="has no score for 1 of the 3 questions compared here"):
        read_other_arm(first / "sft", questions | {"a/4": {"dataset": "a", "type": "x"}}, demo)
    save(first / "rl_gold" / "seed2", 1.0, {"start": "p", "seed": 2}, keys=["a/1"])  # one seed misses a/2
    with pytest.raises(ValueError, match="seed2/result.json has no score for 1 of the 2"):
        read_other_arm(first / "rl_gold", questions, demo)
    save(first / "rl_outcome" / "seed0", 0.0, {"start": "p", "seed": 0})
    save(first / "rl_outcome" / "seed1", 0.0, {"start": "q", "seed": 1})
    with pytest.raises(ValueError, match="seed1/result.json was trained with .*'q'.*share their settings"):
        read_other_arm(first / "rl_outcome", questions, demo)
    (first / "broken").mkdir()
    (first / "broken" / "result.json").write_text("{")
    with pytest.raises(ValueError, match="broken/result.json is not a bench result"):
        read_other_arm(first / "broken", questions, demo)
    with pytest.raises(ValueError, match="no result.json there or in its seed folders"):
        read_other_arm(first / "rft", questions, demo)
    # a seed evaluated under other episode rules (--set env.*) is marked for evaluating its policy again; a rule
    # its run predates is at its default there; without its policy it is refused
    run = demo / "eval" / "rl_gain_1234_sft_more_s0_q200"
    run.mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"env": {"max_steps": 5, "topk": 5}}))
    save(first / "sft_more" / "seed0", 0.0, {"start": "p", "seed": 0})
    result = json.loads((first / "sft_more" / "seed0" / "result.json").read_text())
    result |= {"eval_run": f"elsewhere/eval/{run.name}", "policy": str(tmp_path / "policy")}
    (first / "sft_more" / "seed0" / "result.json").write_text(json.dumps(result))
    assert read_other_arm(
        first / "sft_more", questions, demo, {"max_steps": 5, "answer_at_limit": False}
    ).rules_differ == [{}]
    with pytest.raises(ValueError, match=r"evaluated with env \{'answer_at_limit': False\}.*policy .*policy is gone"):
        read_other_arm(first / "sft_more", questions, demo, {"max_steps": 5, "answer_at_limit": True})
    (tmp_path / "policy").mkdir()
    (tmp_path / "policy" / "config.json").write_text("{}")
    other = read_other_arm(first / "sft_more", questions, demo, {"max_steps": 5, "answer_at_limit": True})
    assert other.rules_differ == [{"answer_at_limit": False}] and other.policies == [str(tmp_path / "policy")]


def test_sft_more_spends_the_fraction_of_an_epoch_too_not_a_rounded_epoch_count():
    rows = [{"id": i} for i in range(10)]
    chosen = sft_passes(rows, 1.42, seed=0)
    counts = [sum(row["id"] == i for row in chosen) for i in range(10)]
    assert len(chosen) == 14 and sorted(counts) == [1] * 6 + [2] * 4  # every example once, four of them twice
    assert sft_passes(rows, 1.42, seed=0) == chosen and sft_passes(rows, 1.42, seed=1) != chosen
    assert len(sft_passes(rows, 2.0, seed=0)) == 20 and len(sft_passes(rows, 0.3, seed=0)) == 3
    assert len(sft_passes(rows, 0.01, seed=0)) == 1  # never an empty epoch
    for bad in (0.0, math.nan, math.inf):
        with pytest.raises(ValueError, match="positive number of passes"):
            sft_passes(rows, bad, seed=0)


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    out = tmp_path_factory.mktemp("rl-gain") / "demo"
    result = run_r3rag("demo", "--model", "tiny-random", "--quick", "--out", str(out), timeout=1200)
    assert result.returncode == 0, result.stderr[-3000:]
    return out


def test_training_time_counts_the_attempts_whose_work_is_kept(tmp_path):
    """An attempt killed before its first checkpoint leaves nothing to resume: the next starts from the start, so
    its time is all the arm spent (it once counted both: an sft_more seed recorded 1,984 s for 1,311 s of SFT).
    One that resumes (a checkpoint, or rft's samples) adds to the earlier attempts' time."""
    folder = tmp_path / "arm" / "seed1"
    for stage in ("sft", "ppo"):
        (folder / "train" / stage).mkdir(parents=True)
    timing = folder / "timing.json"

    def attempt(reused: tuple[Path, ...] = ()) -> float:
        policy = str(folder / "train" / "sft" / "policy")
        return RLGain.timed(None, folder, lambda: policy, reused)[1]  # type: ignore[arg-type]

    def interrupted() -> str:
        raise KeyboardInterrupt

    def killed() -> None:
        with pytest.raises(KeyboardInterrupt):
            RLGain.timed(None, folder, interrupted)  # type: ignore[arg-type]

    def recorded() -> float:
        return json.loads(timing.read_text())["train_s"]

    killed()  # the interrupted attempt's time is written down for a resumption
    assert timing.is_file() and recorded() < 60
    timing.write_text(json.dumps({"train_s": 600.0}))  # a long attempt, killed before any checkpoint
    assert attempt() < 60 and recorded() < 60
    for kept in (folder / "train" / "ppo" / CHECKPOINT_FILE, folder / "train" / "sft" / CHECKPOINT_FILE):
        timing.write_text(json.dumps({"train_s": 600.0}))  # killed after a checkpoint: the rerun resumes from it
        kept.write_bytes(b"")
        assert 600 <= attempt() < 660 and 600 <= recorded() < 660
        kept.unlink()
    timing.write_text(json.dumps({"train_s": 600.0}))  # rft's samples are reused by the rerun
    (folder / "samples").mkdir()
    assert 600 <= attempt((folder / "samples",)) < 660
    timing.write_text(json.dumps({"train_s": 600.0}))  # ... but not work the caller does not name
    assert attempt() < 60
    (folder / "train" / "sft" / DONE_FILE).write_text("{}")  # finished before: its time is read back unchanged
    timing.write_text(json.dumps({"train_s": 600.0}))
    assert attempt() == 600.0 and recorded() == 600.0


@pytest.mark.slow
def test_every_arm_trains_from_the_sft_policy_and_the_table_has_their_rows_and_cis(demo):
    """bench/rl_gain.py on a tiny budget: every arm, two seeds, the same questions; the table has a row per arm
    with CIs around the mean difference (sft's exactly 0); a rerun reads every arm back instead of training it."""
    out = demo / "rl_gain"
    command = [sys.executable, str(ROOT / "bench" / "rl_gain.py"), "--demo", str(demo), "--arms", ",".join(ARMS),
               "--seeds", "0,1", "--episodes", "16", "--dev_questions", "6", "--eval_engine", "hf",
               "--set", "ppo.critic_warmup=0", "--resamples", "500"]  # fmt: skip
    first = subprocess.run(command, capture_output=True, text=True, timeout=3000, cwd=ROOT)
    assert first.returncode == 0, first.stderr[-5000:]
    summary = json.loads((out / "rl_gain.json").read_text())
    assert summary["questions"] == 6 and summary["episodes"] == 16
    assert summary["seeds"] == {"sft": 1, "sft_more": 2, "rl_process": 2, "rl_outcome": 2, "rl_gold": 2, "rft": 2}
    rows = [row for row in summary["rows"] if row["group"] == "world"]
    arms = [row["arm"] for row in rows]
    assert arms[:6] == list(ARMS) and arms[6].startswith("single-shot BM25 @K (world K=")
    # the goal's second comparison: every trained arm against the compute control, on the same questions
    control = [row for row in summary["vs_sft_more"] if row["group"] == "world"]
    assert [row["arm"] for row in control] == ["rl_process", "rl_outcome", "rl_gold", "rft"]
    assert all(row["diff"]["em"]["n"] == 6 for row in control)
    # and per answer form, as the main table splits them (when these 6 questions have both forms): no types
    asked = [row for _, row in iter_jsonl(demo / "world" / "dev.jsonl")][:6]
    counts = Counter(answer_form(row["question"], row["golden_answers"]) for row in asked)
    forms = {f"world / {form} answers" for form in counts} if len(counts) > 1 else set()
    assert forms == {row["group"] for row in summary["rows"] if row["group"].endswith(" answers")}
    by_form = {row["group"]: row for row in summary["vs_sft_more"] if row["group"] != "world" and row["arm"] == "rft"}
    assert {group: row["diff"]["em"]["n"] for group, row in by_form.items()} == {
        f"world / {form} answers": n for form, n in counts.items() if forms}  # fmt: skip
    for row in rows:
        assert row["questions"] == 6
        for metric, diff in row["diff"].items():
            assert diff["lo"] <= diff["mean"] <= diff["hi"], (row["arm"], metric, diff)
            assert diff["n"] == 6
    sft = rows[0]
    assert all(diff == {"mean": 0.0, "lo": 0.0, "hi": 0.0, "n": 6} for diff in sft["diff"].values())
    assert set(sft["diff"]) == {"em", "f1", "full_recall", "docs", "answered", "format_error"}
    bm25 = rows[6]
    assert bm25["mean"]["em"] is None and "em" not in bm25["diff"] and 0 <= bm25["mean"]["full_recall"] <= 1
    # each RL run's Full-Recall beside BM25's at its own documents: the arm over its seeds, and each seed alone
    versus = summary["vs_bm25"]
    assert list(versus) == ["rl_process", "rl_outcome", "rl_gold"]
    # what searching paid in each RL seed's 16 training episodes
    assert list(summary["training_search"]) == [f"{arm}, seed {seed}" for arm in versus for seed in (0, 1)]
    assert all(run["all"]["episodes"] == 16 for run in summary["training_search"].values())
    bm25_rows = {row["arm"]: row["mean"]["full_recall"] for row in rows[6:]}
    for arm, runs in versus.items():
        assert list(runs) == ["2 seeds", "seed 0", "seed 1"]
        assert all(run["world"]["k"] >= 1 and 0 <= run["world"]["bm25_full_recall"] <= 1 for run in runs.values())
        assert all(0 <= run["world"]["bm25_own_full_recall"] <= 1 for run in runs.values())
        seed0 = json.loads((out / arm / "seed0" / "result.json").read_text())["scores"].values()
        assert runs["seed 0"]["world"]["full_recall"] == pytest.approx(
            statistics.fmean(row["full_recall"] for row in seed0))  # fmt: skip
        # over its seeds, it reads the same documents as its row in the main table
        mine = [value for label, value in bm25_rows.items() if f" {arm}" in label or f"; {arm}" in label]
        assert mine == [pytest.approx(runs["2 seeds"]["world"]["bm25_full_recall"])]
    for arm in ARMS[1:]:
        for seed in (0, 1):
            result = json.loads((out / arm / f"seed{seed}" / "result.json").read_text())
            assert len(result["scores"]) == 6 and result["train_s"] > 0
            if arm.startswith("rl_"):
                config = json.loads((out / arm / f"seed{seed}" / "train" / "config.json").read_text())
                assert config["ppo"]["iterations"] == 1 and config["run"]["seed"] == seed
                assert config["reward"]["scheme"] == SCHEMES[arm]
                # its training episodes, each with its steps and outcome, for reading back what it learned
                episodes = [row for _, row in iter_jsonl(out / arm / f"seed{seed}" / "train" / "trajectories.jsonl")]
                assert len(episodes) == 16 and all(row["steps"] and row["outcome"] for row in episodes)
    plan = json.loads((out / "sft_more" / "seed0" / "plan.json").read_text())
    assert plan["passes"] > 0 and plan["target_s"] > 0 and plan["examples"] >= 1
    # planned at its own speed, timed on a short SFT run under the bench's settings, then deleted
    assert plan["sft_s_per_epoch"] > 0 and plan["sft_fixed_s"] >= 0
    assert not (out / "sft_more" / "seed0" / "speed").exists()
    config = json.loads((out / "sft_more" / "seed0" / "train" / "config.json").read_text())
    assert config["model"]["policy"] == str(demo / "train" / "sft" / "policy")
    # one epoch over the passes that match the RL arms' time, written out
    assert config["sft"]["data"] == str(out / "sft_more" / "seed0" / "sft.jsonl") and config["sft"]["epochs"] == 1
    assert len(list(iter_jsonl(out / "sft_more" / "seed0" / "sft.jsonl"))) == plan["examples"]
    rft = json.loads((out / "rft" / "seed0" / "rft.json").read_text())
    assert rft["episodes"] == 16 and 0 <= rft["correct"] <= 16
    table = (out / "rl_gain.md").read_text()
    assert table in first.stdout and "| rl_outcome | 2 | 6 |" in table and "Δ" in table
    assert "| rl_gold, seed 1 | " in table and "at the run's own documents" in table

    mtimes = {path: path.stat().st_mtime for path in out.glob("*/seed*/result.json")}
    again = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stderr.count("read back from") == 11  # sft, and five arms of two seeds
    assert "PPO" not in again.stderr and "SFT:" not in again.stderr  # nothing trained again
    assert {path: path.stat().st_mtime for path in mtimes} == mtimes
    assert json.loads((out / "rl_gain.json").read_text())["rows"] == summary["rows"]
    assert math.isfinite(summary["rows"][0]["mean"]["docs"])

    # one arm and one seed named: the table is still rebuilt from every arm and seed saved in OUT
    subset = command[:]
    subset[subset.index("--arms") + 1], subset[subset.index("--seeds") + 1] = "rl_process", "1"
    third = subprocess.run(subset, capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert third.returncode == 0, third.stderr[-3000:]
    rebuilt = json.loads((out / "rl_gain.json").read_text())
    assert rebuilt["seeds"] == summary["seeds"] and rebuilt["arms"] == list(ARMS)
    assert [(row["arm"], row["group"], row["mean"]) for row in rebuilt["rows"]] == [
        (row["arm"], row["group"], row["mean"]) for row in summary["rows"]
    ]


@pytest.mark.slow
def test_rft_fine_tunes_the_start_on_the_correct_episodes_it_sampled(demo, tmp_path, monkeypatch):
    """The quick demo's tiny policy answers nothing right, so its sampling is stood in for by the scripted
    teacher's trajectories of the same questions, scored correct: the arm keeps them, writes SFT data from them
    and fine-tunes the start on it."""
    import argparse

    from rl_gain import RLGain

    from demo.run import Demo
    from r3_env.data import iter_jsonl, write_jsonl

    teacher = {row["question_id"]: row for _, row in iter_jsonl(demo / "coldstart" / "trajectories.jsonl")}

    def sample(self, policy, data, out, seed):
        assert policy == self.start and self.args.rft_temperature == 1.0
        rows = [{**teacher[item["id"]], "id": f"{data.parent.name}/{item['id']}", "dataset": data.parent.name}
                for _, item in iter_jsonl(data) if item["id"] in teacher]  # fmt: skip
        write_jsonl(out / "predictions.jsonl", rows)
        write_jsonl(out / "question_scores.jsonl", [{"id": row["id"], "correct": True} for row in rows])

    monkeypatch.setattr(RLGain, "sample", sample)
    args = argparse.Namespace(episodes=32, dev_questions=4, rft_temperature=1.0, seed_list=[0],
                              sft_more_seconds=0.0, start="", out=str(tmp_path))  # fmt: skip
    demo_run, _ = Demo.from_folder(demo)
    bench = RLGain(demo_run, args, {})
    bench.urls = ("http://127.0.0.1:9", "http://127.0.0.1:9")  # SFT alone asks no service
    policy, seconds, stats = bench.train_rft(0)
    assert stats["episodes"] == 32 and 0 < stats["correct"] <= 32 and stats["examples"] == stats["correct"]
    assert policy == tmp_path / "rft" / "seed0" / "train" / "sft" / "policy" and (policy / "config.json").is_file()
    config = json.loads((tmp_path / "rft" / "seed0" / "train" / "config.json").read_text())
    assert config["sft"]["data"] == str(tmp_path / "rft" / "seed0" / "sft.jsonl")
    assert config["model"]["policy"] == str(bench.start) and seconds > 0


def test_on_a_real_question_demo_every_arm_trains_and_is_evaluated_under_its_rl_settings(tmp_path):
    """A real-question demo's RL stage has settings of its own (REAL.rl): the RL arms train under them, the
    SFT arms (sft_more, rft) train the same layers at the same rate, every arm is evaluated under their episode
    rules, and a result records them, so one trained under other settings is not read back as this bench's."""
    import argparse

    from conftest import SHARED_DATA

    from demo.run import Demo, DemoConfig
    from demo.settings import REAL

    if not SHARED_DATA.is_dir():
        pytest.skip(f"no shared data at {SHARED_DATA}: the real-question split needs it")
    model = tmp_path / "start"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"num_hidden_layers": 8}))
    demo = Demo(DemoConfig(out=str(tmp_path / "demo"), model=str(model), data=str(SHARED_DATA), eval_engine="hf",
                           rollout_engine="hf"))  # fmt: skip
    args = argparse.Namespace(episodes=32, dev_questions=0, rft_temperature=1.0, seed_list=[0],
                              sft_more_seconds=0.0, start=str(model), out=str(tmp_path / "bench"))  # fmt: skip
    bench = RLGain(demo, args, {"ppo.actor_lr": "1e-5"})
    assert bench.env["query_with_question"] and bench.env["stop_after_action"] and bench.env["question_docs"] == 4
    assert bench.env_changes == {"stop_after_action": True, "query_with_question": True}
    assert bench.arm_settings("sft", None)["env"] == bench.env_changes
    recorded = bench.arm_settings("rl_gold", 0)["recipe"]
    assert recorded["reward.options"] == REAL.rl["reward.options"] and "ppo.actor_lr" not in recorded  # --set's
    assert "reward.scheme" not in recorded  # each RL arm's own
    sft = bench.sft_config(tmp_path / "sft.jsonl", tmp_path / "out", 0, 1)
    assert (sft.model.lora_rank, sft.model.trainable_layers, sft.sft.lr) == (0, 8, REAL.rl["sft.lr"])
    assert bench.per_iteration == 16 and bench.iterations == 2  # the recipe's batch: 4 questions x 4 samples


def test_a_start_without_a_saved_policy_is_refused_naming_the_flag(tmp_path):
    command = [sys.executable, str(ROOT / "bench" / "rl_gain.py"), "--demo", str(tmp_path),
               "--start", str(tmp_path / "nowhere")]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert result.returncode != 0
    assert f"--start {tmp_path / 'nowhere'}: no saved policy there" in result.stderr


def test_settings_the_bench_fixes_itself_are_refused_in_set(tmp_path):
    command = [sys.executable, str(ROOT / "bench" / "rl_gain.py"), "--demo", str(tmp_path),
               "--set", "ppo.iterations=3", "--set", "ppo.actor_lr=1e-6"]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert result.returncode != 0
    assert "--set ppo.iterations (set by --episodes): the bench sets these" in result.stderr


@pytest.mark.slow
def test_another_start_and_a_group_batch_set_the_arms_start_and_their_iterations(demo, tmp_path):
    """--start: every arm starts from that policy (here the demo's PPO policy), sft_more's SFT too; --set's batch
    (8 samples of one question, a group baseline) sets the PPO iterations the episode budget buys."""
    start = (demo / "train" / "ppo" / "policy").resolve()
    out = tmp_path / "from_ppo"
    command = [sys.executable, str(ROOT / "bench" / "rl_gain.py"), "--demo", str(demo), "--arms", "rl_outcome,sft_more",
               "--seeds", "0", "--episodes", "16", "--dev_questions", "4", "--eval_engine", "hf",
               "--start", str(start), "--out", str(out), "--resamples", "200", "--sft_more_seconds", "1",
               "--set", "ppo.critic_warmup=0", "--set", "ppo.estimator=group_norm", "--set", "reward.placement=scalar",
               "--set", "ppo.rollout_batch_size=1", "--set", "ppo.n_samples_per_prompt=8",
               "--set", "ppo.train_batch_size=8"]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=1800, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-5000:]
    summary = json.loads((out / "rl_gain.json").read_text())
    assert summary["episodes"] == 16 and summary["seeds"] == {"sft": 1, "rl_outcome": 1, "sft_more": 1}
    config = json.loads((out / "rl_outcome" / "seed0" / "train" / "config.json").read_text())
    assert config["model"]["policy"] == str(start)
    assert config["ppo"]["iterations"] == 2 and config["ppo"]["n_samples_per_prompt"] == 8
    assert config["ppo"]["estimator"] == "group_norm"
    sft_more = json.loads((out / "sft_more" / "seed0" / "train" / "config.json").read_text())
    assert sft_more["model"]["policy"] == str(start)  # more SFT continues from the start too
    for arm in ("sft", "rl_outcome/seed0", "sft_more/seed0"):
        saved = json.loads((out / arm / "result.json").read_text())
        assert saved["settings"]["start"] == str(start)
    assert json.loads((out / "sft" / "result.json").read_text())["policy"] == str(start)

    # --against: another bench's saved arm on the same questions (here this OUT's own sft, read as a folder)
    label = "from_ppo/sft"
    against = subprocess.run([*command, "--against", str(out / "sft")], capture_output=True, text=True, timeout=900,
                             cwd=ROOT)  # fmt: skip
    assert against.returncode == 0, against.stderr[-3000:]
    summary = json.loads((out / "rl_gain.json").read_text())
    rows = [row for row in summary["against"][label] if row["group"] == "world"]  # and per answer form
    assert [row["arm"] for row in rows] == ["sft", "sft_more", "rl_outcome"]  # ARMS order
    assert all(row["diff"]["em"]["n"] == 4 for row in rows)
    assert rows[0]["diff"]["em"] == {"mean": 0.0, "lo": 0.0, "hi": 0.0, "n": 4}  # the same scores: exactly 0
    assert summary["against_folders"] == {label: str(out / "sft")}
    assert label in [row["arm"] for row in summary["rows"]] and f"### world against {label}" in against.stdout
    elsewhere = tmp_path / "other" / "sft"
    elsewhere.mkdir(parents=True)
    (elsewhere / "result.json").write_text(json.dumps({"scores": {}}))
    refused = subprocess.run([*command, "--against", str(elsewhere)], capture_output=True, text=True, timeout=900,
                             cwd=ROOT)  # fmt: skip
    assert refused.returncode != 0 and "no bench summary" in refused.stderr and "arm 1/" not in refused.stderr
    twice = subprocess.run([*command, "--against", str(out / "sft"), "--against", str(out / "sft")],
                           capture_output=True, text=True, timeout=900, cwd=ROOT)  # fmt: skip
    assert twice.returncode != 0 and f"each is labelled {label}" in twice.stderr

    # --set env.*: every arm is evaluated under those rules, the start and an --against arm (its saved policy) too
    limit = tmp_path / "at_limit"
    rules = [sys.executable, str(ROOT / "bench" / "rl_gain.py"), "--demo", str(demo), "--arms", "sft",
             "--dev_questions", "4", "--eval_engine", "hf", "--start", str(start), "--out", str(limit),
             "--resamples", "200", "--set", "env.answer_at_limit=true", "--against", str(out / "sft_more"),
             "--against", str(out / "rl_outcome")]  # fmt: skip
    again = subprocess.run(rules, capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "evaluated with env {'answer_at_limit': False}; evaluating its policy again" in again.stderr
    assert json.loads((limit / "sft" / "result.json").read_text())["settings"]["env"] == {"answer_at_limit": True}
    prefix = evaluation_run_prefix(limit)  # this bench's runs: every one under the rules
    runs = [json.loads(path.read_text()) for path in (demo / "eval").glob(f"{prefix}*/run.json")]
    names = {run["name"].removeprefix(prefix) for run in runs}
    # the start, the two arms evaluated again, and BM25 at the documents read (the RL arm's per question too)
    assert {"sft_q4", "against_from_ppo_sft_more_0_q4", "against_from_ppo_rl_outcome_0_q4", "bm25_world_k1_q4"} <= names
    assert all(name.startswith("bm25_world_k") for name in names - {"sft_q4"} if not name.startswith("against_"))
    assert all(run["env"]["answer_at_limit"] for run in runs)
    # an --against RL arm's Full-Recall is set beside BM25's at its own documents, as this bench's RL arms are
    versus = json.loads((limit / "rl_gain.json").read_text())["vs_bm25"]
    assert list(versus) == ["from_ppo/rl_outcome"] and list(versus["from_ppo/rl_outcome"]) == ["seed 0"]
