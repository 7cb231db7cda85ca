"""Does the staged retrieval-cost reward lower retrieval with accuracy held? ``lws`` against ``outcome``, over seeds.

    python bench/lws.py [--seeds 0,1,2] [--quick] [--out bench_out/lws]

For each seed, runs ``r3rag demo --recipe lws`` twice on the same budget: with the ``lws`` reward
(stage 2 from half-way through RL) and with ``--scheme outcome`` (the same tags format, SFT and
group-normalised RL, rewarding only the answer and the format). A rerun resumes. It reports

- dev EM, ACC and RC (mean retrievals per question) of the greedy SFT and RL policies, from the
  demo's own evaluations;
- the training RC (mean retrievals per rollout episode) at the end of stage 1 and at the end of
  stage 2, each the mean of that stage's last two iterations, and the training accuracy at the end.

The paper's claim (docs/recipes/lws.md#the-papers-figures): stage 2 lowers RC with accuracy held. Results go to
OUT/lws.json too.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from demo.run import Demo, DemoConfig  # noqa: E402
from demo.settings import METHODS  # noqa: E402
from r3_env.train.metrics import read_metrics  # noqa: E402

SCHEMES = ("lws", "outcome")


def stage_figures(demo: Demo) -> dict[str, float]:
    """Training RC at the end of each stage (mean of its last two iterations) and accuracy at the end."""
    rows = [row for row in read_metrics(demo.out / "train") if row["stage"] == "ppo"]
    switch = METHODS["lws"].switch_at(len(rows))  # the outcome runs have no switch: the same iteration
    stage1, stage2 = rows[:switch], rows[switch:]
    if not stage1 or not stage2:
        raise ValueError(f"{demo.out}: {len(rows)} RL iterations leave a stage empty; run at least 2")

    def tail_mean(part: list[dict], key: str) -> float:
        return statistics.mean(row[key] for row in part[-2:])

    return {
        "rc_stage1": tail_mean(stage1, "retrievals"),
        "rc_stage2": tail_mean(stage2, "retrievals"),
        "train_correct_end": tail_mean(stage2, "correct"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--quick", action="store_true", help="the --quick demo budget")
    parser.add_argument("--out", default="bench_out/lws")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s")
    out = Path(args.out)
    rows = []
    for seed in [int(s) for s in args.seeds.split(",")]:
        for scheme in SCHEMES:
            started = time.perf_counter()
            config = DemoConfig(
                out=str(out / f"{scheme}-seed{seed}"),
                model="tiny-random",  # the policy its results were measured with (docs/results.md)
                recipe="lws",
                scheme="" if scheme == "lws" else scheme,
                seed=seed,
                quick=args.quick,
            )
            demo = Demo(config)
            results = demo.run()
            row = {"seed": seed, "scheme": scheme, **stage_figures(demo)}
            for policy in ("sft", "ppo"):
                for key in ("em", "acc", "avg_retrievals"):
                    row[f"{policy}_{key}"] = results[policy][key]
            rows.append(row)
            print(f"seed {seed}, {scheme}: {time.perf_counter() - started:.0f} s", flush=True)
    (out / "lws.json").write_text(json.dumps(rows, indent=2) + "\n")

    columns = [
        ("SFT EM %", "sft_em", 100),
        ("RL EM %", "ppo_em", 100),
        ("RL ACC %", "ppo_acc", 100),
        ("SFT RC", "sft_avg_retrievals", 1),
        ("RL RC", "ppo_avg_retrievals", 1),
        ("train RC st.1", "rc_stage1", 1),
        ("train RC st.2", "rc_stage2", 1),
        ("train acc % end", "train_correct_end", 100),
    ]
    print(f"\n{'reward':<9}" + "".join(f"{title:>17}" for title, _, _ in columns))
    for scheme in SCHEMES:
        mine = [r for r in rows if r["scheme"] == scheme]
        cells = []
        for _, key, scale in columns:
            values = [scale * r[key] for r in mine]
            deviation = statistics.stdev(values) if len(values) > 1 else 0.0
            cells.append(f"{statistics.mean(values):.2f} ± {deviation:.2f}")
        print(f"{scheme:<9}" + "".join(f"{cell:>17}" for cell in cells))
    print(
        f"({len(rows) // len(SCHEMES)} seeds, mean ± standard deviation; EM, ACC and RC on the dev questions, "
        "greedy; training figures over each stage's last two iterations)"
    )


if __name__ == "__main__":
    main()
