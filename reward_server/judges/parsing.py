"""Reading scores out of what real judge models write.

Relevance: "Relevance: 0.7", "relevance score = 0.70", "Relevance: 0.7/1", "Relevance: 7/10",
"Relevance: 70%", "**Relevance:** **0.8**", "Relevance: 0,8", "Score: 0.7", or a last line that
is only a number ("**0.8**"); a "Relevance" label wins over a "score" one, the last of a kind wins.
A bare number above 1 is read on a 10-point scale when it is at most 10 and on a 100-point scale
when at most 100. Correctness: "Correct: True/False/Yes/No", bold or not, or a last line that is
only the verdict. Anything else is None: the caller retries once and then falls back.
"""

from __future__ import annotations

import re

_NUMBER = r"(\d+(?:[.,]\d+)?|[.,]\d+)"  # a decimal comma reads as a point ("0,8")
_SCALE = rf"\s*(%|/\s*{_NUMBER})?"
_FILLER = r"[\s*_`]*"
# "Relevance" may be followed by its number directly; a bare "score" needs ":" or "=" ("would score 0" is prose)
_RELEVANCE = re.compile(rf"relevance(?:\s+score)?{_FILLER}[:=]?{_FILLER}{_NUMBER}{_SCALE}", re.IGNORECASE)
_SCORE = re.compile(rf"\bscore{_FILLER}[:=]{_FILLER}{_NUMBER}{_SCALE}", re.IGNORECASE)
_BARE_SCORE = re.compile(rf"^{_FILLER}{_NUMBER}{_SCALE}[\s*_`.]*$")
# a verdict counts when it ends its line: "Correct: True or False? False" is not a verdict
_LABELLED_VERDICT = re.compile(
    rf"(?:correct(?:ness)?|verdict|judg(?:e)?ment){_FILLER}[:=]{_FILLER}(true|false|yes|no){_FILLER}[.!]?{_FILLER}$",
    re.IGNORECASE | re.MULTILINE,
)
_BARE_VERDICT = re.compile(r"^[\s*_`]*(true|false|yes|no)[\s*_`.!]*$", re.IGNORECASE)


def _to_unit(number: str, percent_or_fraction: str | None, denominator: str | None) -> float | None:
    value = float(number.replace(",", "."))
    if percent_or_fraction == "%":
        value /= 100
    elif denominator is not None:
        denominator_value = float(denominator.replace(",", "."))
        if denominator_value <= 0:
            return None
        value /= denominator_value
    elif value > 1:
        value = value / 10 if value <= 10 else value / 100 if value <= 100 else None
        if value is None:
            return None
    return min(1.0, max(0.0, value))


def parse_relevance(text: str, snap_to_tenths: bool = False) -> float | None:
    """The relevance score in [0, 1] a judge wrote, or None when there is none."""
    matches = list(_RELEVANCE.finditer(text)) or list(_SCORE.finditer(text))  # "Relevance" outranks "score"
    found = matches[-1].groups() if matches else None
    if found is None:
        for line in reversed(text.strip().splitlines()):
            bare = _BARE_SCORE.match(line)
            if bare:
                found = bare.groups()
                break
            if line.strip():
                break  # only the last non-empty line may be a bare number
    if found is None:
        return None
    score = _to_unit(*found)
    if score is not None and snap_to_tenths:
        score = round(score * 10) / 10
    return score


def parse_correctness(text: str) -> bool | None:
    """The verdict a judge wrote, or None when there is none."""
    matches = list(_LABELLED_VERDICT.finditer(text))
    word = matches[-1].group(1) if matches else None
    if word is None:
        lines = [line for line in text.strip().splitlines() if line.strip()]
        bare = _BARE_VERDICT.match(lines[-1]) if lines else None
        word = bare.group(1) if bare else None
    return None if word is None else word.lower() in ("true", "yes")


def analysis_of(text: str, limit: int = 500) -> str:
    """The judge's justification: its reply without the final score or verdict line."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    if lines and (
        _RELEVANCE.search(lines[-1])
        or _SCORE.search(lines[-1])
        or _LABELLED_VERDICT.search(lines[-1])
        or _BARE_SCORE.match(lines[-1])
        or _BARE_VERDICT.match(lines[-1])
    ):
        lines = lines[:-1]
    return " ".join(" ".join(lines).split())[:limit]
