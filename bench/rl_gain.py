"""What does RL add to a finished SFT policy? RL arms against SFT on the same questions, with paired bootstrap CIs.

    python bench/rl_gain.py --demo DEMO_OUT [--arms sft,sft_more,rl_process,rl_outcome,rl_gold,rft] [--seeds 0,1,2]
        [--episodes 256] [--dev_questions 200] [--set KEY=VALUE ...] [--eval_engine vllm]
        [--rollout_engine vllm] [--sft_more_seconds S] [--resamples 2000] [--start POLICY] [--against ARM_FOLDER]
        [--bm25_reader] [--out DEMO_OUT/rl_gain]

DEMO_OUT is a finished ``r3rag demo`` folder (the synthetic world, or real questions with ``--data``);
its SFT policy is every arm's start, or ``--start``'s saved policy: for example an earlier bench's
``sft_more`` policy, to ask whether RL adds anything once more SFT has been spent (``sft_more`` then
continues SFT from it). The arms:

- ``sft``: the start itself (evaluated once: greedy decoding has no seed);
- ``sft_more``: SFT continued on the demo's cold-start SFT data for the wall time the RL arms took at
  the same seed (their mean, read from their saved timings; ``--sft_more_seconds`` sets it): one epoch
  over as many passes of the examples as fit in it at the arm's own SFT speed (timed first on a few steps
  under the same ``--set``), whole copies and then a seeded share for the fraction (the compute control;
  its own wall time is reported beside the RL arms');
- ``rl_process``: PPO with the R3 reward (``reward.scheme r3``: per-step relevance, outcome-scaled);
- ``rl_outcome``: PPO with the outcome reward (``reward.scheme outcome``), everything else equal;
- ``rl_gold``: PPO with the R3 reward whose per-step relevance comes from the labels, not a judge
  (``reward.scheme r3_gold``: the share of the question's gold passages each step found first), everything
  else equal; it needs gold passage ids, so report it apart from the judged arms;
- ``rft``: rejection-sampling fine-tuning (expert iteration): the start samples the same number of
  episodes on train questions (PPO's samples per question, temperature ``--rft_temperature``),
  the correct ones (the reward server's verdict) become SFT data (Algorithm 2) and the start is
  fine-tuned on them for the demo's SFT epochs.

Every RL arm samples the same ``--episodes``: PPO runs ceil(episodes / (rollout_batch_size x
n_samples_per_prompt)) iterations of its batch (the demo's, or ``--set``'s ppo.rollout_batch_size and
ppo.n_samples_per_prompt); ``rft`` samples ceil(episodes / n_samples) questions n_samples times.
``--set`` (dotted ``r3rag train local`` keys, as bench/ppo_ablation.py's) applies to every arm that
trains. Under it are the demo's own RL settings, where its recipe has them (a real-question demo's
``REAL.rl`` in demo/settings.py: the measured design): the RL arms train under all of them (the arm's
``reward.scheme`` over theirs), ``sft_more`` and ``rft`` under their ``model.*`` and ``sft.*`` (the layers
and rate RL trains), and every arm, ``sft`` included, is evaluated under their episode rules (``env.*``).

Each arm is evaluated greedy through the demo's evaluation (``--eval_engine``) on the same
questions: the first ``--dev_questions`` of the world's dev set (200 by default), or every question of
the real-data eval split. Per question: EM, F1, Full-Recall, documents read, answered, format error.
The table gives each arm's means per dataset, per question type and per answer form (closed: yes/no, or
one of the choices the question offers, where a guess between two scores about half; open: the rest;
``r3_env.answers.answer_form``), each question's score averaged
over the arm's seeds first), each arm minus ``sft`` with a paired bootstrap 95% CI that resamples the
questions and each arm's seeds (``eval.compare.seeded_paired_bootstrap``: a training run is itself a
draw, and one SFT run's EM varies by 2-5 points on the world), and single-shot BM25 at the same
documents as rows: the question as the one query, top-K with K the mean documents read per dataset by
``sft`` and by each RL arm (a row per K), retrieval only (Full-Recall; with ``--bm25_reader`` on real
questions the demo's untrained model also reads the documents, naive RAG as bench/real_data_learning.py
does, for EM and F1). Since an arm's seeds can read different numbers of documents, a last table puts
each RL run's Full-Recall (the arm over its seeds, and each seed) beside BM25's at that run's own K per
dataset, and beside BM25's at each question's own documents (a mean rounded to K can favour either side).
With ``sft_more`` in OUT, a second table gives every other trained arm
minus ``sft_more`` per dataset and answer form, the same way: the comparison that says whether RL beat
more SFT.
``--against ARM_FOLDER`` (repeatable) adds another bench's saved arm on the same questions, for example
the first bench's ``sft`` when this one starts from its ``sft_more``: a row of the table, and a table of
every arm here minus it (per dataset and answer form); an RL arm's Full-Recall is also set beside BM25's at
its own documents, as this bench's RL arms are.

Each (arm, seed) trains into OUT/ARM/seedS/train (a rerun resumes) and keeps its per-question scores in
OUT/ARM/seedS/result.json, so seeds can run in separate invocations and the table is rebuilt from every
result there. An RL arm's training episodes (steps, queries, documents, outcome;
``policy.trajectory_log``) are appended to OUT/ARM/seedS/train/trajectories.jsonl in rollout order; a table
sums up what searching paid in them, per RL seed: the share of all episodes that searched (first half and
last half of the run), the episodes whose searches found a gold passage their start lacked, and the mean
reward with and without a search. RL can only learn to search from episodes where searching paid. The
table is printed (markdown) and written to OUT/rl_gain.md and OUT/rl_gain.json.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import logging
import math
import random
import shutil
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ppo_ablation import parse_settings  # noqa: E402
from rl_gain_results import (  # noqa: E402
    RESULT,
    TRAJECTORIES,
    OtherArm,
    build_table,
    comparison_rows,
    format_table,
    format_training_search,
    format_versus_bm25,
    is_rl_arm,
    read_other_arm,
    scored,
    seed_mean,
    seed_of,
    seed_summary,
    training_search,
)

from demo.run import Demo  # noqa: E402
from eval.compare import question_scores, question_set  # noqa: E402
from r3_env.allocator import keep_freed_memory  # noqa: E402
from r3_env.config import ConfigError  # noqa: E402

logger = logging.getLogger("rl_gain")

ARMS = ("sft", "sft_more", "rl_process", "rl_outcome", "rl_gold", "rft")
RL_SCHEMES = {"rl_process": "r3", "rl_outcome": "outcome", "rl_gold": "r3_gold"}
BM25 = "bm25"


def evaluation_run_prefix(out: Path) -> str:
    """The prefix of a bench's evaluation runs. They live in the demo's eval folder, named by the bench's OUT, so
    two benches never share one."""
    return f"rl_gain_{hashlib.sha1(str(out.resolve()).encode()).hexdigest()[:8]}_"


# optimizer steps of the short SFT run that times sft_more's settings before its passes are planned
CALIBRATION_STEPS = 4


def sft_passes(rows: list[dict[str, Any]], passes: float, seed: int) -> list[dict[str, Any]]:
    """``passes`` passes over ``rows`` as one list: whole copies, then a seeded share for the fraction left
    (at least one row). Rounding to whole epochs would under- or over-spend the compute control by up to
    half an epoch. Trained as one epoch, it checkpoints only at its end, as the demo's one-epoch SFT does."""
    if not (passes > 0 and math.isfinite(passes)) or not rows:
        raise ValueError(f"sft_more needs a positive number of passes over some examples, not {passes} over "
                         f"{len(rows)}: check the RL arms' timings and the demo's SFT data")  # fmt: skip
    whole, fraction = divmod(passes, 1.0)
    share = round(fraction * len(rows))
    rest = random.Random(seed).sample(rows, share if whole or share else 1)
    return rows * int(whole) + rest


def sft_seconds_per_epoch(run: Path) -> float:
    """A training run's SFT seconds per epoch: its median step interval (a pause between a killed run and its
    resumption does not count) times its steps per epoch, from its metrics.jsonl."""
    from r3_env.train.metrics import read_metrics

    rows = [row for row in read_metrics(run) if row["stage"] == "sft"]
    if len(rows) < 2:
        raise ValueError(f"{run}: too few SFT steps in its metrics.jsonl to time an epoch of SFT")
    step = statistics.median(b["time"] - a["time"] for a, b in zip(rows, rows[1:], strict=False))
    if step <= 0:
        raise ValueError(f"{run}: its metrics.jsonl times SFT steps at {step} s: the step times are not usable")
    return step * len(rows) / max(row["epoch"] for row in rows)


# -- the bench ----------------------------------------------------------------------------------


class RLGain:
    """The arms of one invocation: trained (resumed) and evaluated into OUT, with the services started once."""

    def __init__(self, demo: Demo, args: argparse.Namespace, settings: dict[str, str]) -> None:
        self.demo, self.args, self.settings = demo, args, settings
        self.out = Path(args.out)
        self.start = Path(args.start).resolve() if args.start else demo.finished_sft_policy()
        self.data = demo.sources()
        self.rl_settings = demo.rl_settings()  # the demo's RL stage's own settings, where its recipe has them
        # the batch PPO will run: the demo's RL stage's, as --set changes it
        config = demo.train_config(self.start, "", self.data.prompts, "", "")
        config = config.with_settings({**self.rl_settings, **settings})
        ppo = config.ppo
        # every arm is evaluated under the demo's RL rules, and --set env.* changes the episode for every arm, so
        # evaluation (the start's too) follows it; the changes from the cold start's rules are each result's record
        changed = sorted(key.split(".", 1)[1] for key in settings if key.startswith("env."))
        self.env = {**demo.rl_env, **{key: getattr(config.rollout.env, key) for key in changed}}
        self.env_changes = {key: value for key, value in self.env.items() if demo.env.get(key) != value}
        # the demo's RL settings that --set leaves as they are (and each RL arm's scheme its own): recorded too, so
        # a result trained under others (an older demo's) is refused, not mixed in
        given = {*settings, "reward.scheme"}
        self.recipe_settings = {key: value for key, value in self.rl_settings.items() if key not in given}
        self.samples = ppo.n_samples_per_prompt
        self.per_iteration = ppo.rollout_batch_size * self.samples
        self.iterations = math.ceil(args.episodes / self.per_iteration)
        self.rft_questions = math.ceil(args.episodes / self.samples)
        self.dev_questions = args.dev_questions if args.dev_questions is not None else (0 if demo.config.data else 200)
        self.questions = question_set(self.data.eval, self.dev_questions)
        self.run_prefix = evaluation_run_prefix(self.out)
        self.urls: tuple[str, str] = ("", "")

    def folder(self, arm: str, seed: int | None) -> Path:
        return self.out / arm if seed is None else self.out / arm / f"seed{seed}"

    def arm_settings(self, arm: str, seed: int | None) -> dict[str, Any]:
        """What the arm's result depends on: a result.json saved with others is refused, not mixed in."""
        if arm == "sft":
            return {"start": str(self.start)} | ({"env": self.env_changes} if self.env_changes else {})
        common = {"start": str(self.start), "seed": seed, "set": self.settings}
        common |= {"recipe": self.recipe_settings} if self.recipe_settings else {}
        if arm in RL_SCHEMES:
            return {**common, "episodes": self.iterations * self.per_iteration, "iterations": self.iterations}
        if arm == "rft":
            return {**common, "episodes": self.rft_questions * self.samples, "questions": self.rft_questions,
                    "temperature": self.args.rft_temperature}  # fmt: skip
        return common  # sft_more: its wall time is recorded, not fixed in advance

    def read_result(self, arm: str, seed: int | None, strict: bool = True) -> dict[str, Any] | None:
        """The saved result, if any; one saved with other settings stops the run (``strict``) or is skipped."""
        path = self.folder(arm, seed) / RESULT
        if not path.is_file():
            return None
        result = json.loads(path.read_text())
        wanted = self.arm_settings(arm, seed)
        mismatch = f"trained with {result['settings']}, not {wanted}" if result["settings"] != wanted else ""
        if arm == "sft_more" and "passes" not in result:  # an older bench's plan in whole epochs: another budget
            mismatch = mismatch or "planned in whole epochs by an older bench, not in passes"
        if mismatch:
            if strict:
                sys.exit(f"{path} was {mismatch}: give another --out")
            logger.warning("%s left out of the table: %s", path, mismatch)
            return None
        return result

    def write_result(self, arm: str, seed: int | None, result: dict[str, Any]) -> None:
        path = self.folder(arm, seed) / RESULT
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".tmp")
        partial.write_text(json.dumps(result, indent=2) + "\n")
        partial.replace(path)

    # -- training -----------------------------------------------------------------------------

    def timed(self, folder: Path, train: Any, reused: Sequence[Path] = ()) -> tuple[Path, float]:
        """``train()``'s policy and its wall time (OUT/.../timing.json). Earlier attempts count when this one
        resumes: from a checkpoint or a finished stage in train/ppo or train/sft, or from ``reused`` work
        (rft's samples); work after the last checkpoint counts though it is redone. An attempt with nothing to
        resume from starts again, so the time of the attempts before it is dropped (sft_more is one epoch,
        checkpointed only at its end)."""
        from r3_env.train.models import CHECKPOINT_FILE, finished

        stages = (folder / "train" / "ppo", folder / "train" / "sft")
        timing = folder / "timing.json"
        done_before = any(finished(stage) for stage in stages)
        resumes = any((stage / CHECKPOINT_FILE).is_file() for stage in stages) or any(p.exists() for p in reused)
        spent = json.loads(timing.read_text())["train_s"] if timing.is_file() and (done_before or resumes) else 0.0
        started = time.perf_counter()
        try:
            policy = train()
        finally:  # an interrupted attempt's time is kept for the attempt that resumes it
            if not done_before:
                spent += time.perf_counter() - started
                folder.mkdir(parents=True, exist_ok=True)
                timing.write_text(json.dumps({"train_s": round(spent, 1)}) + "\n")
        return Path(policy), spent

    def train_rl(self, arm: str, seed: int) -> tuple[Path, float]:
        folder = self.folder(arm, seed)
        # every training episode's record (steps, queries, documents, outcome), in rollout order, for reading back
        # what the arm learned
        trajectories = str(folder / "train" / TRAJECTORIES)
        settings = {"seed": seed, "reward.scheme": RL_SCHEMES[arm], "ppo.iterations": self.iterations,
                    "policy.trajectory_log": trajectories, **self.settings}  # fmt: skip
        return self.timed(folder, lambda: self.demo.ppo_again(settings, folder / "train", self.urls, self.start))

    def sft_config(self, data: Path | str, out: Path, seed: int, epochs: int) -> Any:
        """SFT from the start (sft_more, rft): the layers and rate of the demo's RL stage, where it has its own, so
        the controls train what the RL arms train."""
        config = self.demo.train_config(self.start, data, self.data.prompts, *self.urls)
        shared = {key: value for key, value in self.rl_settings.items() if key.startswith(("model.", "sft."))}
        return config.with_settings({**shared, "out": str(out), "seed": seed, "sft.epochs": epochs, **self.settings})

    def sft_more_seconds(self, seed: int) -> float:
        """The wall time to match: --sft_more_seconds, else the mean of the RL arms' at this seed (any seed's
        without them)."""
        if self.args.sft_more_seconds:
            return self.args.sft_more_seconds
        for seeds in ([seed], self.args.seed_list):
            times = [t for arm in RL_SCHEMES for s in seeds if (t := self.train_seconds(arm, s)) is not None]
            if times:
                return statistics.fmean(times)
        sys.exit(f"sft_more matches an RL arm's wall time: run an RL arm ({', '.join(RL_SCHEMES)}) first (or in "
                 "the same invocation, before it), or give --sft_more_seconds")  # fmt: skip

    def train_seconds(self, arm: str, seed: int) -> float | None:
        result = self.read_result(arm, seed)
        return None if result is None else result["train_s"]

    def train_sft_more(self, seed: int) -> tuple[Path, float, dict[str, Any]]:
        from r3_env.train.local import CONFIG_FILE, train_local

        target = self.sft_more_seconds(seed)
        demo_train = json.loads((self.demo.out / "train" / CONFIG_FILE).read_text())
        data = demo_train["sft"]["data"]
        folder = self.folder("sft_more", seed)
        examples = folder / "sft.jsonl"
        saved = folder / "plan.json"  # fixed once: a resumed run keeps it
        if saved.is_file():
            plan = json.loads(saved.read_text())
            if "passes" not in plan:
                sys.exit(f"{saved} is an older bench's plan in whole epochs: give another --out, or delete "
                         f"{folder} to plan it again")  # fmt: skip
        else:
            # one epoch over as many passes of the examples as fit in the target at this arm's own SFT speed
            from r3_env.data import iter_jsonl, write_jsonl

            rows = [row for _, row in iter_jsonl(data)]
            per_epoch, fixed = self.time_sft_epoch(rows, folder / "speed", seed)
            if target > fixed:
                passes = (target - fixed) / per_epoch
            else:
                logger.warning("sft_more: loading and saving alone take %.0f s, over the %.0f s target: it trains "
                               "on one example", fixed, target)  # fmt: skip
                passes = 1 / len(rows)
            chosen = sft_passes(rows, passes, seed)
            write_jsonl(examples, chosen)
            plan = {"target_s": round(target, 1), "sft_s_per_epoch": round(per_epoch, 1),
                    "sft_fixed_s": round(fixed, 1), "passes": round(passes, 3), "examples": len(chosen),
                    "of": len(rows)}  # fmt: skip
            saved.write_text(json.dumps(plan) + "\n")
        per_epoch = plan.get("sft_s_per_epoch", plan.get("demo_sft_s_per_epoch"))  # the latter: an older bench's plan
        logger.info("sft_more seed %d: %.2f passes over the %d examples of %s (one epoch of %d) to match %.0f s of RL "
                    "(SFT under these settings: %.0f s an epoch)", seed, plan["passes"], plan["of"], data,
                    plan["examples"], plan["target_s"], per_epoch)  # fmt: skip
        config = self.sft_config(examples, folder / "train", seed, 1)
        policy, spent = self.timed(folder, lambda: train_local(config, stages=("sft",))["sft"])
        return policy, spent, plan

    def time_sft_epoch(self, rows: list[dict[str, Any]], out: Path, seed: int) -> tuple[float, float]:
        """(seconds an epoch of ``rows`` takes, seconds a run spends besides its steps) under this bench's
        settings, timed on a short SFT run of CALIBRATION_STEPS optimizer steps from the start.

        The demo's own SFT speed would misplan it whenever ``--set`` changes how SFT runs (trainable layers,
        precision, LoRA): on real questions a plan at the demo's LoRA speed spent 344 s of a 920 s target.
        The fixed part (loading, the first step's warm-up, saving) comes off the target first: small at
        SmolLM2's size (15 s on real questions), larger for bigger models. The short run is not counted as
        training, and its policy is deleted once timed."""
        from r3_env.data import write_jsonl
        from r3_env.train.local import train_local

        config = self.sft_config(out / "sft.jsonl", out / "train", seed, 1)
        sample = sft_passes(rows, CALIBRATION_STEPS * config.sft.batch_size / len(rows), seed)  # copies if few
        write_jsonl(out / "sft.jsonl", sample)
        logger.info("sft_more: timing %d SFT steps under this bench's settings (%s)", CALIBRATION_STEPS, out)
        started = time.monotonic()
        train_local(config, stages=("sft",))
        wall = time.monotonic() - started
        per_sample = sft_seconds_per_epoch(out / "train") / len(sample)
        shutil.rmtree(out)
        return per_sample * len(rows), max(wall - per_sample * len(sample), 0.0)

    def sample(self, policy: Path, data: Path, out: Path, seed: int) -> None:
        """Sampled (not greedy) episodes of ``policy`` on ``data`` through the evaluation, scored by the reward
        server (its verdict: ``correct`` in question_scores.jsonl)."""
        from eval.score import ScoreConfig, score_run
        from r3_env.runs import JudgeClientConfig

        settings = {"data": str(data), "out": str(out), "name": out.name, "max_questions": 0, "concurrency": 32,
                    "step_format": self.demo.config.method.step_format, "method": "r3"}  # fmt: skip
        generation = {"temperature": self.args.rft_temperature, "seed": seed}
        self.demo.run_episodes(settings, policy, self.urls[0], self.env, generation)
        asyncio.run(score_run(ScoreConfig(run=str(out)), JudgeClientConfig(url=self.urls[1])))

    def train_rft(self, seed: int) -> tuple[Path, float, dict[str, Any]]:
        """Expert iteration: the start's sampled episodes on train questions, its correct ones SFT data, SFT."""
        from r3_env.coldstart.sft_data import SFTDataConfig, build_sft_data
        from r3_env.data import iter_jsonl, read_dataset, write_jsonl
        from r3_env.train.local import train_local

        folder = self.folder("rft", seed)
        samples = self.samples

        def train() -> Path:
            prompts = folder / "prompts.jsonl"
            if not prompts.is_file():  # a seeded draw of train questions, as PPO draws its batches
                items = read_dataset(self.data.prompts)
                chosen = random.Random(seed).sample(items, min(self.rft_questions, len(items)))
                write_jsonl(prompts, [item.to_json() for item in chosen])
            kept = []
            for k in range(samples):
                run = folder / "samples" / f"sample{k}"
                logger.info("rft seed %d: sample %d/%d of %d questions", seed, k + 1, samples, self.rft_questions)
                self.sample(self.start, prompts, run, seed * 1000 + k)
                correct = {row["id"] for _, row in iter_jsonl(run / "question_scores.jsonl") if row["correct"]}
                kept += [{**row, "id": f"{row['id']}#{k}", "outcome": "correct"}
                         for _, row in iter_jsonl(run / "predictions.jsonl") if row["id"] in correct]  # fmt: skip
            trajectories = folder / "trajectories.jsonl"
            write_jsonl(trajectories, kept)
            stats = {"episodes": samples * self.rft_questions, "correct": len(kept)}
            if kept:
                sft = folder / "sft.jsonl"
                built = build_sft_data(SFTDataConfig(input=str(trajectories), out=str(sft), tokenizer=str(self.start),
                                                     doc_chars=self.demo.env["doc_chars"],
                                                     step_format=self.demo.config.method.step_format))  # fmt: skip
                stats["examples"] = built["examples"]
            (folder / "rft.json").write_text(json.dumps(stats) + "\n")
            logger.info("rft seed %d: %d of %d sampled episodes correct", seed, len(kept), stats["episodes"])
            if not stats.get("examples"):
                logger.warning("rft seed %d: no correct episode to train on; the arm is the start itself", seed)
                return self.start
            config = self.sft_config(folder / "sft.jsonl", folder / "train", seed, self.demo.budget.sft_epochs)
            return train_local(config, stages=("sft",))["sft"]

        policy, spent = self.timed(folder, train, reused=[folder / "samples"])  # sampling resumes per question
        return policy, spent, json.loads((folder / "rft.json").read_text())

    # -- evaluation ---------------------------------------------------------------------------

    def evaluate(self, name: str, policy: Path, data: str, **extra: Any) -> Path:
        """Greedy evaluation through the demo's (resumes); the run's folder. A run older than its policy (the arm
        was trained again) is evaluated afresh, not resumed."""
        name = self.run_prefix + name
        run = self.demo.out / "eval" / name
        predictions, weights = run / "predictions.jsonl", policy / "config.json"
        if predictions.is_file() and weights.is_file() and predictions.stat().st_mtime < weights.stat().st_mtime:
            logger.warning("%s is older than its policy %s: evaluating it afresh", run, policy)
            shutil.rmtree(run)
        self.demo.evaluate(name, policy, data, *self.urls, max_questions=self.dev_questions, env=self.env, **extra)
        return self.demo.paths[f"eval_{name}"]

    def evaluate_again(self, other: OtherArm) -> None:
        """``--against`` seeds evaluated under other episode rules, evaluated again under this bench's (from their
        saved policies, into this bench's evaluation runs): a difference is only paired under the same rules."""
        for number, differ in enumerate(other.rules_differ):
            if differ:
                logger.info("--against %s: its run %d was evaluated with env %s; evaluating its policy again under "
                            "this bench's rules", other.label, number, differ)  # fmt: skip
                name = f"against_{other.label.replace('/', '_')}_{number}_q{self.dev_questions}"
                run = self.evaluate(name, Path(other.policies[number]), self.data.eval)
                other.scores[number] = question_scores(run, self.questions)

    def run_arm(self, arm: str, seed: int | None) -> dict[str, Any]:
        result = self.read_result(arm, seed)
        if result is not None:
            logger.info("%s%s: read back from %s", arm, "" if seed is None else f" seed {seed}", self.folder(arm, seed))
            return result
        extra: dict[str, Any] = {}
        if arm == "sft":
            policy, spent = self.start, 0.0
        elif arm in RL_SCHEMES:
            policy, spent = self.train_rl(arm, seed)
        elif arm == "sft_more":
            policy, spent, extra = self.train_sft_more(seed)
        else:
            policy, spent, extra = self.train_rft(seed)
        name = arm if seed is None else f"{arm}_s{seed}"
        run = self.evaluate(f"{name}_q{self.dev_questions}", policy, self.data.eval)
        result = {"arm": arm, "seed": seed, "settings": self.arm_settings(arm, seed), "policy": str(policy),
                  "train_s": round(spent, 1), **extra, "eval_run": str(run),
                  "scores": question_scores(run, self.questions)}  # fmt: skip
        self.write_result(arm, seed, result)
        return result

    def bm25_rows(
        self, arms: dict[str, list[dict[str, dict[str, Any]]]]
    ) -> tuple[dict[str, list[dict]], dict[str, dict[str, int]]]:
        """Single-shot BM25 at the documents each of ``sft`` and the RL arms read, per dataset: ({row label:
        per-question scores}, {arm: K per dataset}). The goal compares an RL arm's Full-Recall with BM25 at
        its own documents, which differ from the start's once RL learns to search more or less."""
        ks = {arm: self.matched_ks(arms[arm]) for arm in arms if arm == "sft" or arm.startswith("rl_")}
        matching: dict[tuple, list[str]] = defaultdict(list)  # arms that read as many documents
        for arm, per_dataset in ks.items():
            matching[tuple(per_dataset.items())].append(arm)
        rows = {}
        for per_dataset, names in matching.items():
            at = ", ".join(f"{name} K={k}" for name, k in per_dataset)
            rows[f"single-shot BM25 @K ({at}; {', '.join(names)}'s documents)"] = [self.bm25_scores(dict(per_dataset))]
        return rows, ks

    def versus_bm25(
        self, arms: dict[str, list[dict[str, dict[str, Any]]]], seeds: dict[str, list[int | None]]
    ) -> dict[str, dict[str, dict[str, dict[str, float]]]]:
        """Each RL arm's Full-Recall per dataset beside single-shot BM25's at its own documents: {arm: {run:
        {dataset: {k, full_recall, bm25_full_recall, bm25_own_full_recall}}}}, the run being the arm over its
        seeds and, with more than one, each seed alone. Seeds that learned to search more or less read different
        numbers of documents, so a K from their mean can match none of them; the goal asks for each run's own.
        ``bm25_own_full_recall`` matches each question's own documents instead of the dataset's mean rounded,
        which can favour either side by up to half a document per question."""
        checks: dict[str, dict[str, dict[str, dict[str, float]]]] = {}
        for arm in filter(is_rl_arm, arms):
            runs = {f"{len(arms[arm])} seeds": arms[arm]} if len(arms[arm]) > 1 else {}
            runs |= {f"seed {seed}": [scores] for seed, scores in zip(seeds[arm], arms[arm], strict=True)}
            checks[arm] = {}
            for label, per_seed in runs.items():
                ks = self.matched_ks(per_seed)
                bm25 = self.bm25_scores(ks)
                own = self.bm25_at_own_documents(per_seed)
                checks[arm][label] = {}
                for name, k in ks.items():
                    keys = [key for key, info in self.questions.items() if info["dataset"] == name]
                    mine = [v for key in keys if (v := seed_mean(per_seed, key, "full_recall")) is not None]
                    theirs = [bm25[key]["full_recall"] for key in keys if scored(bm25, key, "full_recall")]
                    matched = [own[key] for key in keys if key in own]
                    checks[arm][label][name] = {
                        "k": k,
                        "full_recall": statistics.fmean(mine) if mine else 0.0,
                        "bm25_full_recall": statistics.fmean(theirs) if theirs else 0.0,
                        "bm25_own_full_recall": statistics.fmean(matched) if matched else 0.0,
                    }
        return checks

    def bm25_at_own_documents(self, per_seed: list[dict[str, dict[str, Any]]]) -> dict[str, float]:
        """Single-shot BM25's Full-Recall per question at the documents that question's episode read, averaged
        over the seeds: one retrieval-only BM25 run per dataset and K read (an episode that read nothing: 0)."""
        from r3_env.runs import dataset_names, dataset_paths

        names = dataset_names(dataset_paths(self.data.eval))

        def counted(rows: dict[str, dict[str, Any]], key: str) -> bool:  # its own Full-Recall defined: gold named
            return scored(rows, key, "docs") and scored(rows, key, "full_recall")

        read = {int(rows[key]["docs"]) for rows in per_seed for key in self.questions if counted(rows, key)}
        at = {k: self.bm25_scores(dict.fromkeys(names, k), reader=False) for k in sorted(read - {0})}
        matched = {}
        for key in self.questions:
            values = []
            for rows in (rows for rows in per_seed if counted(rows, key)):
                k = int(rows[key]["docs"])
                if not k:
                    values.append(0.0)
                elif scored(at[k], key, "full_recall"):
                    values.append(at[k][key]["full_recall"])
            if values:
                matched[key] = statistics.fmean(values)
        return matched

    def matched_ks(self, arm: list[dict[str, dict[str, Any]]]) -> dict[str, int]:
        """The arm's mean documents read per dataset, as BM25's K."""
        from eval.metrics import matched_k
        from r3_env.runs import dataset_names, dataset_paths

        ks = {}
        for name in dataset_names(dataset_paths(self.data.eval)):
            keys = [key for key, info in self.questions.items() if info["dataset"] == name]
            docs = [d for key in keys if (d := seed_mean(arm, key, "docs")) is not None]
            ks[name] = matched_k(statistics.fmean(docs) if docs else 1.0)
        return ks

    def bm25_scores(self, ks: dict[str, int], reader: bool = True) -> dict[str, dict[str, Any]]:
        """Per-question scores of single-shot BM25 at ``ks`` (K per dataset); each (dataset, K) runs once.
        Retrieval only (Full-Recall, in seconds), unless ``--bm25_reader`` on real questions (and ``reader``):
        then the demo's untrained model reads the K documents (naive RAG) for EM and F1 too, about 25 minutes
        per K over the 508 real eval questions on 2 cores. The world's untrained policy is random, so it never
        reads them."""
        from r3_env.runs import dataset_names, dataset_paths

        files = dataset_paths(self.data.eval)
        scores: dict[str, dict[str, Any]] = {}
        for name, path in zip(dataset_names(files), files, strict=True):
            k = ks[name]
            if reader and self.demo.config.data and self.args.bm25_reader:
                run = self.evaluate(f"{BM25}_rag_{name}_k{k}_q{self.dev_questions}", self.demo.untrained_policy,
                                    str(path), eval_method="naive_rag", naive_topk=k)  # fmt: skip
            else:
                run = self.evaluate(f"{BM25}_{name}_k{k}_q{self.dev_questions}", self.start, str(path),
                                    eval_method="single_shot", naive_topk=k)  # fmt: skip
            mine = {key: info for key, info in self.questions.items() if info["dataset"] == name}
            scores.update(question_scores(run, mine))
        return scores


def parse_args() -> tuple[argparse.Namespace, list[str], dict[str, str]]:
    """The command line, checked: the arguments, the arms asked for and the ``--set`` settings (exits naming a bad
    one)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--demo", required=True, help="a finished demo's --out folder (its SFT policy is the start unless --start)"
    )
    parser.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, of {', '.join(ARMS)}")
    parser.add_argument("--seeds", default="0,1,2", help="seeds of every arm but sft")
    parser.add_argument("--episodes", type=int, default=256, help="sampled episodes of each RL arm")
    parser.add_argument(
        "--dev_questions",
        type=int,
        default=None,
        help="the world's first N dev questions (default 200); real data: per dataset (default: all)",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a dotted r3rag train local setting of every trained arm (e.g. ppo.actor_lr=1e-5)",
    )
    parser.add_argument("--eval_engine", choices=("hf", "vllm"), default="vllm", help="as r3rag demo's")
    parser.add_argument("--rollout_engine", choices=("hf", "vllm"), default="hf", help="PPO's, as r3rag demo's")
    parser.add_argument("--vllm_python", default=str(ROOT / ".venv-vllm" / "bin" / "python"))
    parser.add_argument(
        "--sft_more_seconds",
        type=float,
        default=0.0,
        help="sft_more's wall time (0: the RL arms' mean, from their saved timings)",
    )
    parser.add_argument(
        "--bm25_reader",
        action="store_true",
        help="real questions: the demo's untrained model also reads the BM25 rows' documents (naive RAG) for EM "
        "and F1, about 25 min per K over 508 questions on 2 cores (default: retrieval only, Full-Recall)",
    )
    parser.add_argument("--rft_temperature", type=float, default=1.0, help="rft's sampling temperature")
    parser.add_argument("--resamples", type=int, default=2000, help="bootstrap resamples of the questions")
    parser.add_argument(
        "--start",
        default="",
        help="every arm's start: a saved policy folder (default: the demo's SFT policy, DEMO/train/sft/policy)",
    )
    parser.add_argument(
        "--against",
        action="append",
        default=[],
        metavar="ARM_FOLDER",
        help="another bench's saved arm on the same questions (e.g. OUT/sft of the bench whose sft_more is "
        "--start): a row of the table, and a table of every arm here minus it",
    )
    parser.add_argument("--out", default="", help="default: DEMO/rl_gain")
    args = parser.parse_args()  # fmt: skip
    arms = [arm.strip() for arm in args.arms.split(",") if arm.strip()]
    unknown = [arm for arm in arms if arm not in ARMS]
    if unknown or not arms:
        sys.exit(f"--arms: {', '.join(unknown) or 'none given'}; choose from {', '.join(ARMS)}")
    if args.episodes < 1 or args.resamples < 1 or (args.dev_questions is not None and args.dev_questions < 0):
        sys.exit("--episodes and --resamples must be at least 1, --dev_questions 0 or more")
    try:
        args.seed_list = [int(s) for s in args.seeds.split(",") if s.strip()]
        settings = parse_settings(args.set)
    except (ValueError, ConfigError) as error:
        sys.exit(f"--seeds / --set: {error}")
    fixed = {"ppo.iterations": "--episodes", "seed": "--seeds", "reward.scheme": "--arms"}
    if taken := [f"{key} (set by {flag})" for key, flag in fixed.items() if key in settings]:
        sys.exit(f"--set {', '.join(taken)}: the bench sets these for every arm; leave them out of --set")
    if args.start and not (Path(args.start) / "config.json").is_file():
        sys.exit(f"--start {args.start}: no saved policy there (no config.json); give a policy folder, e.g. an "
                 "earlier bench's OUT/sft_more/seed0/train/sft/policy")  # fmt: skip
    args.out = args.out or str(Path(args.demo) / "rl_gain")
    return args, arms, settings


def open_bench(args: argparse.Namespace, settings: dict[str, str]) -> RLGain:
    """The demo and the bench over it, with the start found once (RLGain reads it from ``args``)."""
    try:
        demo, _ = Demo.from_folder(args.demo, eval_engine=args.eval_engine, rollout_engine=args.rollout_engine,
                                   vllm_python=args.vllm_python)  # fmt: skip
    except ValueError as error:
        sys.exit(f"--demo: {error}")
    try:
        args.start = args.start or str(demo.finished_sft_policy())
    except ValueError as error:
        sys.exit(f"--demo: {error}, or give --start POLICY")
    try:
        return RLGain(demo, args, settings)
    except ValueError as error:  # --set settings PPO refuses: the message names them
        sys.exit(str(error))


def read_against(bench: RLGain, args: argparse.Namespace) -> tuple[dict[str, OtherArm], dict[str, str]]:
    """``--against``'s arms by label, and each one's folder; read before anything trains, so that a wrong folder is
    refused up front."""
    others: dict[str, OtherArm] = {}
    folders: dict[str, str] = {}
    for folder in args.against:
        try:
            other = read_other_arm(Path(folder), bench.questions, Path(args.demo), bench.env)
        except ValueError as error:
            sys.exit(str(error))
        label = other.label
        if label in others:
            sys.exit(f"--against {folders[label]}, {folder}: each is labelled {label} (OUT's name/arm); give "
                     "each folder once, and give benches of the same arm different --out names")  # fmt: skip
        others[label], folders[label] = other, str(Path(folder).resolve())
    return others, folders


@dataclass
class Collected:
    """Every (arm, seed) of OUT's scores and per-seed summaries, and the BM25 rows beside them."""

    results: dict[str, list[dict[str, Any]]]
    per_seed: dict[str, list[dict[str, Any]]]
    bm25: dict[str, list[dict[str, dict[str, Any]]]]
    bm25_k: dict[str, Any]
    versus: dict[str, Any]


def run_arms(
    bench: RLGain, arms: list[str], args: argparse.Namespace, others: dict[str, OtherArm], started: float
) -> Collected:
    """Train (or resume) and evaluate the arms asked for, then read every other arm saved in OUT, and score BM25
    at the documents the arms read; the services run once for all of it. ``started``: the clock the ETA counts from."""
    # sft first (every difference is to it), the RL arms before sft_more (it matches their wall time)
    ordered = sorted(set(arms) | {"sft"}, key=["sft", *RL_SCHEMES, "rft", "sft_more"].index)
    jobs = [("sft", None)] + [(arm, seed) for arm in ordered if arm != "sft" for seed in args.seed_list]
    results: dict[str, list[dict[str, Any]]] = defaultdict(list)
    per_seed: dict[str, list[dict[str, Any]]] = defaultdict(list)
    with bench.demo.serving() as urls:
        bench.urls = urls
        for other in others.values():
            bench.evaluate_again(other)
        for number, (arm, seed) in enumerate(jobs, start=1):
            done = time.perf_counter() - started
            eta = f", about {done / (number - 1) * (len(jobs) - number + 1) / 60:.0f} min to go" if number > 1 else ""
            logger.info("arm %d/%d: %s%s (%.0f s so far%s)", number, len(jobs), arm,
                        "" if seed is None else f" seed {seed}", done, eta)  # fmt: skip
            try:
                result = bench.run_arm(arm, seed)
            except ConfigError as error:
                sys.exit(str(error))
            results[arm].append(result["scores"])
            per_seed[arm].append(seed_summary(result))
        # every (arm, seed) saved in OUT counts, earlier invocations' too: an arm this invocation did not
        # name joins the table when its settings match these (else it is left out, with a warning)
        for arm in ARMS[1:]:
            for path in sorted(bench.folder(arm, None).glob(f"seed*/{RESULT}")):
                seed = seed_of(path)
                if arm in ordered and seed in args.seed_list:
                    continue
                if (saved := bench.read_result(arm, seed, strict=arm in ordered)) is not None:
                    results[arm].append(saved["scores"])
                    per_seed[arm].append(seed_summary(saved))
        bm25, ks = bench.bm25_rows(results)
        # RL arms of --against too (their policies evaluated again under this bench's rules, say)
        rl_others = {name: other for name, other in others.items() if other.is_rl}
        versus = bench.versus_bm25(
            {**results, **{name: other.scores for name, other in rl_others.items()}},
            {**{arm: [m["seed"] for m in per_seed[arm]] for arm in results},
             **{name: other.seeds for name, other in rl_others.items()}},
        )  # fmt: skip
    return Collected(results, per_seed, bm25, ks, versus)


def report(
    bench: RLGain,
    args: argparse.Namespace,
    collected: Collected,
    others: dict[str, OtherArm],
    against_folders: dict[str, str],
    started: float,
) -> None:
    """The tables, printed and written to OUT/rl_gain.md, and everything behind them to OUT/rl_gain.json (with the
    seconds since ``started``, the arms' first)."""
    results, per_seed = collected.results, collected.per_seed
    listed = [arm for arm in ARMS if arm in results]  # this invocation's arms and every other arm saved in OUT
    arms_here = {arm: results[arm] for arm in listed}
    table_arms = arms_here | {name: other.scores for name, other in others.items()} | collected.bm25
    rows = build_table(table_arms, bench.questions, args.resamples)
    world = "real-data eval split" if bench.demo.config.data else "world dev"
    note = (f"{len(bench.questions)} {world} questions, greedy ({args.eval_engine}); RL arms: {bench.iterations} "
            f"PPO iterations x {bench.per_iteration} episodes; Δ: arm minus sft, paired bootstrap 95% CI over the "
            f"questions and each arm's seeds ({args.resamples} resamples), each question averaged over the arm's "
            f"seeds first; closed answers: yes/no or a choice the question offers (a guess scores about half); "
            f"BM25's K matches the documents read by the arms its row names")  # fmt: skip
    table = format_table(rows, note)
    # the goal's second comparison: each trained arm against the compute control, per dataset and answer form
    control = []
    if "sft_more" in results and len(listed) > 2:
        trained = {arm: scores for arm, scores in arms_here.items() if arm != "sft"}
        control = comparison_rows(trained, bench.questions, args.resamples, "sft_more")
        table += "\n" + format_table(control, "Δ: arm minus sft_more, the same paired bootstrap", base="sft_more")
    against: dict[str, list[dict[str, Any]]] = {}
    for name, other in others.items():  # each arm here against another bench's arm, on the same questions
        against[name] = comparison_rows(arms_here | {name: other.scores}, bench.questions, args.resamples, name)
        caption = f"{name}: {against_folders[name]}; Δ: arm minus it, the same paired bootstrap"
        table += "\n" + format_table(against[name], caption, base=name)
    if collected.versus:
        table += "\n" + format_versus_bm25(collected.versus)
    runs = [(arm, m["seed"]) for arm in ARMS if arm.startswith("rl_") for m in per_seed.get(arm, [])]
    searching = {f"{arm}, seed {seed}": summary for arm, seed in runs
                 if (summary := training_search(bench.folder(arm, seed))) is not None}  # fmt: skip
    if searching:
        table += "\n" + format_training_search(searching)
    table += "\nEach seed's means over every question (EM %, F1 %, training wall time):\n\n"
    for arm in (arm for arm in ARMS if arm in per_seed):
        cells = [f"seed {'-' if m['seed'] is None else m['seed']}: {100 * m['em']:.1f}, {100 * m['f1']:.1f}, "
                 f"{m['train_s']:.0f} s" for m in per_seed[arm]]  # fmt: skip
        table += f"- {arm}: " + "; ".join(cells) + "\n"
    seeds = {arm: len(saved) for arm, saved in results.items()}
    summary = {"demo": str(Path(args.demo).resolve()), "arms": listed, "seeds": seeds,
               "questions": len(bench.questions), "episodes": bench.iterations * bench.per_iteration,
               "bm25_k": collected.bm25_k, "vs_bm25": collected.versus, "training_search": searching,
               "per_seed": per_seed, "rows": rows, "vs_sft_more": control,
               "against": against, "against_folders": against_folders,
               "seconds": round(time.perf_counter() - started)}  # fmt: skip
    out = Path(args.out)
    (out / "rl_gain.json").write_text(json.dumps(summary, indent=2) + "\n")
    (out / "rl_gain.md").write_text(table)
    print(table, flush=True)


def main() -> None:
    args, arms, settings = parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    bench = open_bench(args, settings)
    others, against_folders = read_against(bench, args)
    started = time.perf_counter()
    collected = run_arms(bench, arms, args, others, started)
    report(bench, args, collected, others, against_folders, started)


if __name__ == "__main__":
    keep_freed_memory()  # PyTorch's buffers kept between steps: r3_env/allocator.py
    main()
