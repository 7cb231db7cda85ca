"""The lexical judge: no model, a documented fallback and baseline, never the paper's judge.

Relevance: the share of the query's key terms (capitalised names and numbers, else its content
words), and to a lesser degree the question's, that appear in the documents. Correctness: the
normalised prediction contains a gold answer as whole words, has the same words in another order
("12 March 1921" / "March 12 1921"), or has token F1 of at least ``f1_threshold`` with one.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence

from r3_env.answers import answer_matches, f1_score, normalize_answer
from reward_server.judges.base import CorrectnessItem, Judge, JudgeResult, RelevanceItem

_STOPWORDS = frozenset(
    "a an the of in on at to for from by with and or but is are was were be been being who whom whose what which "
    "when where why how did does do has have had this that these those it its as into than then there their his "
    "her he she they them we you i me my our your not no yes also about after before during same first".split()
)
_ENTITY = re.compile(r"\b(?:[A-Z][\w'-]*(?:\s+(?:of|the|de|von|van|and)?\s*[A-Z][\w'-]*)*|\d{3,4})\b")


def key_terms(text: str) -> set[str]:
    """Names and years in ``text`` (normalised), else its content words."""
    entities = {normalize_answer(m.group(0)) for m in _ENTITY.finditer(text)}
    entities = {e for e in entities if e and e not in _STOPWORDS}
    if entities:
        return entities
    return {w for w in normalize_answer(text).split() if w not in _STOPWORDS}


def coverage(terms: set[str], documents: str) -> float:
    if not terms:
        return 0.0
    haystack = f" {documents} "
    return sum(f" {term} " in haystack for term in terms) / len(terms)


class LexicalJudge(Judge):
    backend = "lexical"

    def __init__(self, snap_to_tenths: bool = False, f1_threshold: float = 0.8, question_weight: float = 0.3) -> None:
        self.snap_to_tenths, self.f1_threshold, self.question_weight = snap_to_tenths, f1_threshold, question_weight

    def relevance_score(self, item: RelevanceItem) -> float:
        documents = normalize_answer(" ".join(item.documents))
        query = coverage(key_terms(item.query), documents)
        question = coverage(key_terms(item.question), documents)
        score = (1 - self.question_weight) * query + self.question_weight * question
        return round(score * 10) / 10 if self.snap_to_tenths else round(score, 4)

    def correct(self, item: CorrectnessItem) -> bool:
        prediction = normalize_answer(item.prediction)
        for gold in item.golden_answers:
            if answer_matches(item.prediction, [gold]):
                return True
            if prediction and Counter(prediction.split()) == Counter(normalize_answer(gold).split()):
                return True
        return f1_score(item.prediction, list(item.golden_answers)) >= self.f1_threshold

    async def relevance(self, items: Sequence[RelevanceItem]) -> list[JudgeResult]:
        return [JudgeResult(self.relevance_score(item), self.backend) for item in items]

    async def correctness(self, items: Sequence[CorrectnessItem]) -> list[JudgeResult]:
        return [JudgeResult(float(self.correct(item)), self.backend) for item in items]
