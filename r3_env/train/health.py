"""PPO's health monitor: each iteration, the signs of a policy going wrong, logged and kept.

Three kinds of sign (thresholds in :class:`~r3_env.train.config.HealthConfig`, the ``health:`` section):

- **Rising shares.** Unanswered episodes (``no_answer``: out of steps or context without an
  answer), format errors (``format_error``), and three shares of the policy's queries:

  - ``blank_queries``: blank among the query attempts: a query with no word in it, or a format
    error for an empty query (attempts a format regeneration dropped are not seen);
  - ``repeated_queries``: among the non-blank queries, those that repeat an earlier query of their
    episode after normalisation (lower case, words only: punctuation and spacing do not count);
  - ``copied_queries``: among the non-blank queries, those that copy the question: the Jaccard
    similarity of their normalised word sets is at least ``copy_similarity`` (1.0: the same words,
    which includes normalised-text equality; the default 0.8 also catches a question with a word
    or two dropped, while a hop's sub-question shares too few of a multi-hop question's words).

  A share's baseline is its mean over the first ``baseline_iterations`` iterations; from the next
  one on it warns when it is more than ``share_margin`` above that baseline and at least
  ``share_floor``.
- **Drifts.** Retrievals (searches) per episode: their mean over the last ``drift_window``
  iterations, the current one included, warns when it is above ``drift_factor`` times its baseline
  (the mean of the first ``baseline_iterations``) or below the baseline divided by it. A baseline of
  0 (a policy that did not search at first) never warns. A process reward that sums each step's
  relevance pays for searching again: a policy trained on it can learn to re-run a search "with
  different words" until its steps run out, while the query shares stay under their floor. The
  window keeps one iteration of a few questions from warning alone. The sign reports a change of
  behaviour, for the better or the worse.
- **Spikes.** The KL to the reference warns above ``spike_factor`` times its median over the
  ``spike_window`` iterations before (and above ``kl_floor``, so a KL near zero never spikes);
  the entropy above that factor times its median (a spike) or below its median divided by it (a
  collapse onto a few tokens). Spikes, too, are measured from iteration ``baseline_iterations + 1``.

The query shares join the iteration's logged values (``metrics.jsonl``, TensorBoard and the
report's Health charts). Each warning is one ``logger.warning`` line naming the sign, the value and
its baseline; ``ppo/health.jsonl`` gets one line per iteration (its signs' values, baselines and
warnings), append-only: a resumed run logs again the iterations after its checkpoint, so readers
keep the last line of each iteration (:func:`read_health` does). The monitor's history is part of
the trainer's checkpoint.
"""

from __future__ import annotations

import logging
import math
import re
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from r3_env.data import JsonlWriter
from r3_env.train.metrics import read_latest_rows

if TYPE_CHECKING:  # the config module imports the agent's sections; the report reads this module without them
    from r3_env.train.config import HealthConfig

logger = logging.getLogger(__name__)

HEALTH_FILE = "health.jsonl"
QUERIES_KEY = "r3rag_queries"  # r3_env.openrlhf.agent.QUERIES_KEY (importing the agent loads OpenRLHF)

# (metric, what it counts): the shares that warn when they rise
SHARES = {
    "no_answer": "unanswered episodes",
    "format_error": "format errors",
    "blank_queries": "blank queries",
    "repeated_queries": "repeated queries",
    "copied_queries": "queries copying the question",
}
# (metric, what it counts): the values that warn when their recent mean drifts from the baseline, either way
DRIFTS = {"retrievals": "retrievals per episode"}
# (metric, what it measures): the values that warn when they spike
SPIKES = {"kl": "KL to the reference", "entropy": "entropy"}


def words(text: str) -> list[str]:
    """The normalised form of a query or question: its lower-case words, punctuation and spacing dropped."""
    return re.findall(r"\w+", text.lower())


def jaccard(a: Sequence[str], b: Sequence[str]) -> float:
    sa, sb = set(a), set(b)
    return len(sa & sb) / len(sa | sb) if sa | sb else 1.0


def query_shares(responses: Sequence[dict[str, Any]], copy_similarity: float = 0.8) -> dict[str, float]:
    """Blank, repeated and copied queries as shares (see the module's docstring); 0 where there is no query."""
    attempts = blank = kept = repeated = copied = 0
    for response in responses:
        episode = response.get(QUERIES_KEY) or {}
        question = words(episode.get("question") or "")
        blank += int(episode.get("blank") or 0)
        attempts += int(episode.get("blank") or 0)
        seen: set[tuple[str, ...]] = set()
        for query in episode.get("queries") or []:
            attempts += 1
            normal = tuple(words(query or ""))
            if not normal:
                blank += 1
                continue
            kept += 1
            repeated += normal in seen
            copied += bool(question) and jaccard(normal, question) >= copy_similarity
            seen.add(normal)
    return {
        "blank_queries": blank / attempts if attempts else 0.0,
        "repeated_queries": repeated / kept if kept else 0.0,
        "copied_queries": copied / kept if kept else 0.0,
    }


@dataclass(frozen=True)
class HealthWarning:
    """One sign at one iteration: ``value`` of ``metric`` against its ``baseline`` (warns past ``threshold``)."""

    iteration: int
    sign: str  # "no_answer rising", "kl spike", "entropy collapse", ...
    metric: str
    value: float
    baseline: float
    threshold: float
    message: str


@dataclass
class HealthCheck:
    """What one iteration's check found: the values to log beside the iteration's, and the warnings."""

    values: dict[str, float]
    warnings: list[HealthWarning] = field(default_factory=list)


class HealthMonitor:
    """Checks each iteration's episodes and logged values; warns, and appends to ``path`` (None: no file)."""

    def __init__(self, config: HealthConfig | None = None, path: Path | None = None) -> None:
        if config is None:
            from r3_env.train.config import HealthConfig

            config = HealthConfig()
        self.config = config
        self.path = Path(path) if path is not None else None
        self.history: dict[str, list[float]] = {name: [] for name in (*SHARES, *DRIFTS, *SPIKES)}
        self._writer: JsonlWriter | None = None

    def check(self, iteration: int, responses: Sequence[dict[str, Any]], values: dict[str, float]) -> HealthCheck:
        """Iteration ``iteration`` (from 1) with its episode responses and logged values (``no_answer``,
        ``format_error``, ``retrievals``, ``kl``, ``entropy``: those absent, as ``entropy`` without an actor
        update, are skipped)."""
        shares = query_shares(responses, self.config.copy_similarity)
        current = {**values, **shares}
        seen = {name: value for name in self.history if (value := _number(current.get(name))) is not None}
        warnings, baselines = [], {}
        for name, value in seen.items():
            past = self.history[name]
            if len(past) < self.config.baseline_iterations:
                continue
            if name in SPIKES:
                before = past[-self.config.spike_window :]
                baselines[name] = statistics.median(before)
                warnings += self._spikes(iteration, name, value, baselines[name], len(before))
                continue
            baselines[name] = statistics.fmean(past[: self.config.baseline_iterations])
            if name in SHARES:
                warnings += self._rising(iteration, name, value, baselines[name])
            else:
                recent = [*past, value][-self.config.drift_window :]
                warnings += self._drifts(iteration, name, statistics.fmean(recent), baselines[name], len(recent))
        for name, value in seen.items():
            self.history[name].append(value)
        for warning in warnings:
            logger.warning("PPO health, iteration %d: %s", iteration, warning.message)
        row = {"iteration": iteration, "time": round(time.time(), 3), "values": seen, "baselines": baselines}
        self._write({**row, "warnings": [asdict(w) for w in warnings]})
        return HealthCheck({**shares, "health_warnings": float(len(warnings))}, warnings)

    def _rising(self, iteration: int, name: str, value: float, baseline: float) -> list[HealthWarning]:
        config = self.config
        threshold = max(baseline + config.share_margin, config.share_floor)
        if value <= baseline + config.share_margin or value < config.share_floor:
            return []
        message = f"{SHARES[name]} rising: {name} {value:.3f}, baseline {baseline:.3f} (warns above {threshold:.3f})"
        return [HealthWarning(iteration, f"{name} rising", name, value, baseline, threshold, message)]

    def _drifts(self, iteration: int, name: str, recent: float, baseline: float, window: int) -> list[HealthWarning]:
        """``recent`` (the mean of the last ``window`` iterations) above ``drift_factor`` times the baseline, or below
        the baseline divided by it."""
        if baseline <= 0:
            return []
        factor = self.config.drift_factor
        against = f"{name} {recent:.3g} over the last {window} iterations, baseline {baseline:.3g}"
        if recent > factor * baseline:
            direction, threshold, bound = "rising", factor * baseline, "above"
        elif recent < baseline / factor:
            direction, threshold, bound = "falling", baseline / factor, "below"
        else:
            return []
        message = f"{DRIFTS[name]} {direction}: {against} (warns {bound} {threshold:.3g})"
        return [HealthWarning(iteration, f"{name} {direction}", name, recent, baseline, threshold, message)]

    def _spikes(self, iteration: int, name: str, value: float, median: float, window: int) -> list[HealthWarning]:
        """Above ``spike_factor`` times the median (and ``kl_floor`` for the KL); the entropy also below it divided."""
        config, warnings = self.config, []
        against = f"median {median:.4g} of the last {window} iterations"
        high = config.spike_factor * max(median, 0.0)
        if name == "kl":
            high = max(high, config.kl_floor)
        if value > high and (name == "kl" or median > 0):
            message = f"{SPIKES[name]} spike: {name} {value:.4g}, {against} (warns above {high:.4g})"
            warnings.append(HealthWarning(iteration, f"{name} spike", name, value, median, high, message))
        low = median / config.spike_factor
        if name == "entropy" and median > 0 and value < low:
            message = f"{SPIKES[name]} collapse: {name} {value:.4g}, {against} (warns below {low:.4g})"
            warnings.append(HealthWarning(iteration, "entropy collapse", name, value, median, low, message))
        return warnings

    def _write(self, row: dict[str, Any]) -> None:
        if self.path is None:
            return
        if self._writer is None:
            self._writer = JsonlWriter(self.path)
        self._writer.write(row)

    def state_dict(self) -> dict[str, Any]:
        return {"history": {name: list(values) for name, values in self.history.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name, values in (state.get("history") or {}).items():
            self.history[name] = list(values)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def _number(value: Any) -> float | None:
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def read_health(path: Path) -> list[dict[str, Any]]:
    """``health.jsonl``'s lines in iteration order, the last line of each iteration winning (a resumed run's)."""
    return read_latest_rows(path, HEALTH_FILE, lambda row: row["iteration"])


def read_warnings(path: Path) -> list[dict[str, Any]]:
    """Every warning of :func:`read_health`'s lines, in iteration order."""
    return [warning for row in read_health(path) for warning in row.get("warnings") or []]
