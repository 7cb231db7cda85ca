"""Answer normalisation and string metrics, with FlashRAG's exact semantics.

- :func:`normalize_answer`: SQuAD normalisation (lowercase, drop punctuation, drop articles,
  collapse whitespace), in FlashRAG's order.
- :func:`exact_match`, :func:`f1_score`, :func:`sub_exact_match` (FlashRAG's "acc": the normalised
  gold is a substring of the normalised prediction), all taking the best gold answer.
- :func:`answer_matches`: the string-match half of the R3 correctness reward; a gold answer's
  normalised tokens appear as a whole-word run in the prediction's (so "no" does not match "not
  known", which the character-level sub-EM accepts).
- :func:`clean_answer`: the short answer inside a final step's answer text.
- :func:`answer_form`: "closed" when a guess has even odds (yes/no, or one of the choices the question
  offers), else "open".
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Sequence

_PUNCTUATION = set(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_SPECIAL_ANSWERS = ("yes", "no", "noanswer")


def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lower, remove punctuation, remove articles, collapse whitespace."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def answer_form(question: str, golden_answers: str | Sequence[str]) -> str:
    """The answer's form: "closed" when the gold answer is yes/no, or the question offers a choice (" or ") and
    names it ("Who was born later, A or B?"), so a guess between two scores about half; "open" otherwise. Only
    the first gold answer counts: aliases such as "IN" for India would match any question. EM on closed
    questions can rise without retrieval, so bench/rl_gain.py's tables read them apart."""
    answers = _as_list(golden_answers)
    if not answers:
        return "open"
    gold, asked = normalize_answer(answers[0]), normalize_answer(question)
    if gold in ("yes", "no"):
        return "closed"
    offers_choice = " or " in f" {asked} "
    return "closed" if offers_choice and gold and f" {gold} " in f" {asked} " else "open"


def _as_list(golden_answers: str | Sequence[str]) -> list[str]:
    return [golden_answers] if isinstance(golden_answers, str) else list(golden_answers)


def exact_match(prediction: str, golden_answers: str | Sequence[str]) -> float:
    """1.0 if the normalised prediction equals any normalised gold answer."""
    normalized = normalize_answer(prediction)
    return float(any(normalize_answer(gold) == normalized for gold in _as_list(golden_answers)))


def sub_exact_match(prediction: str, golden_answers: str | Sequence[str]) -> float:
    """1.0 if any normalised gold answer is a substring of the normalised prediction (FlashRAG "acc")."""
    normalized = normalize_answer(prediction)
    return float(any(normalize_answer(gold) in normalized for gold in _as_list(golden_answers)))


def token_scores(prediction: str, golden_answers: str | Sequence[str]) -> dict[str, float]:
    """Token-level F1, precision and recall, each the best over the gold answers.

    As in FlashRAG (and HotpotQA's evaluator), a yes/no/noanswer prediction or gold scores 0
    unless both are the same special answer. Note that the three maxima are taken independently.
    """
    best = {"f1": 0.0, "precision": 0.0, "recall": 0.0}
    normalized_prediction = normalize_answer(prediction)
    prediction_tokens = normalized_prediction.split()
    for gold in _as_list(golden_answers):
        normalized_gold = normalize_answer(gold)
        if normalized_prediction in _SPECIAL_ANSWERS and normalized_prediction != normalized_gold:
            continue
        if normalized_gold in _SPECIAL_ANSWERS and normalized_prediction != normalized_gold:
            continue
        gold_tokens = normalized_gold.split()
        common = sum((Counter(prediction_tokens) & Counter(gold_tokens)).values())
        if common == 0:
            continue
        precision = common / len(prediction_tokens)
        recall = common / len(gold_tokens)
        f1 = 2 * precision * recall / (precision + recall)
        best["f1"] = max(best["f1"], f1)
        best["precision"] = max(best["precision"], precision)
        best["recall"] = max(best["recall"], recall)
    return best


def f1_score(prediction: str, golden_answers: str | Sequence[str]) -> float:
    return token_scores(prediction, golden_answers)["f1"]


CORRECT_SCORE = 0.5  # a judge's correctness score at or above which an answer counts as right (ACC)


def judged_correct(score: float) -> bool:
    """Whether a correctness score (a judge's, or a match's 1.0) makes the answer right: one threshold for the
    rollout's outcome, the cold start's kept samples, the reward server and evaluation's ACC."""
    return score >= CORRECT_SCORE


def settled_by_string(answer: str | None, golden_answers: Sequence[str]) -> tuple[str, bool | None]:
    """The cleaned answer, and what a string settles before any judge is asked (free): wrong when empty, right when
    it matches a gold answer as whole normalised words, None when only a judge can tell."""
    prediction = clean_answer(answer or "")
    if not prediction:
        return prediction, False
    return prediction, True if answer_matches(prediction, golden_answers) else None


def answer_matches(prediction: str, golden_answers: str | Sequence[str]) -> bool:
    """Whether a gold answer occurs in the prediction as whole normalised words (EM included)."""
    prediction_tokens = normalize_answer(prediction).split()
    if not prediction_tokens:
        return False
    for gold in _as_list(golden_answers):
        gold_tokens = normalize_answer(gold).split()
        if not gold_tokens:
            continue
        width = len(gold_tokens)
        if any(prediction_tokens[i : i + width] == gold_tokens for i in range(len(prediction_tokens) - width + 1)):
            return True
    return False


_LEAD_INS = re.compile(
    r"^(?:so,?\s+|therefore,?\s+|thus,?\s+)?(?:the\s+(?:final\s+|short\s+)?answer\s+(?:is|would\s+be)\s*:?\s*|"
    r"answer\s*:\s*|final\s+answer\s*:\s*)",
    re.IGNORECASE,
)
_WRAPPERS = ("**", "__", "`", '"', "'", "\u201c", "\u201d", "*", "_")


def clean_answer(answer_text: str) -> str:
    """The short answer in a final step's answer text.

    Keeps the first line, drops lead-ins ("The answer is", "Answer:"), markdown emphasis,
    surrounding quotes and a trailing full stop. Everything else is kept: scoring normalises
    further, and over-eager trimming would invent wrong answers.
    """
    lines = [line.strip() for line in answer_text.splitlines() if line.strip()]
    if not lines:
        return ""
    text = _LEAD_INS.sub("", lines[0]).strip()
    changed = True
    while changed and text:
        changed = False
        if text.endswith(".") and not re.search(r"\b[A-Z]\.$|\.\.\.$", text):
            text, changed = text[:-1].rstrip(), True
        for mark in _WRAPPERS:
            if len(text) > 2 * len(mark) and text.startswith(mark) and text.endswith(mark):
                text, changed = text[len(mark) : -len(mark)].strip(), True
    return text
