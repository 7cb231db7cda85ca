"""The evidence teacher: cold-start trajectories written from the datasets' own annotations, no teacher LLM.

Multi-hop datasets annotate the chain of evidence behind each question; each link becomes one
retrieval step aimed at one gold paragraph (:func:`evidence_hops`):

- 2WikiMultihopQA (``evidences``: subject, relation, object triples): one query per triple naming
  the subject and the relation, aimed at the gold paragraph about the subject; comparison
  questions thereby query each entity;
- MuSiQue and the synthetic world (``question_decomposition``): the sub-questions, with MuSiQue's
  ``#k`` replaced by the k-th earlier answer, aimed at the paragraph that answers each;
- HotpotQA (``supporting_titles``): a comparison (both titles named in the question) queries each
  entity; a bridge question first retrieves with the question itself, then with the bridge entity
  the first gold paragraph names (the other supporting title).

:class:`EvidenceTeacher` writes those steps in varied wordings and answers with the golden answer once
every hop's paragraph was shown; a hop whose paragraph an earlier step already showed is skipped
(:func:`aimed_hops`). Under ``env.question_docs`` the first analysis names the hops the question's own
documents hold before the one it searches for. It applies Algorithm 1's rejection to retrieval: when a
step's documents miss its gold paragraph it gives up (answers "unknown"), so rejection sampling drops the
trajectory and the acceptance rate measures how often the annotated chain is retrievable step by step.
"""

from __future__ import annotations

import dataclasses
import difflib
import itertools
import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from r3_env.coldstart.teacher import (
    FOUND_ALL,
    FOUND_MORE,
    QUESTION_DOCS_HOLD,
    QUESTION_DOCS_LACK,
    SEARCH_FOUND,
    PlanningTeacher,
    TeacherRequest,
)
from r3_env.data import QAItem
from r3_env.protocol import Step


@dataclass(frozen=True)
class Hop:
    """One link of the evidence chain: a query, the gold paragraph it should bring back, what it is for."""

    query: str
    gold_id: str
    need: str  # the missing fact, as the analysis names it
    fact: str = ""  # the fact once found, as the final step cites it ("" when the annotation has none)


class EvidenceError(ValueError):
    """The item's annotation does not give an evidence chain."""


def _supporting(item: QAItem) -> list[tuple[str, str]]:
    """(gold id, title) pairs, in the annotation's order."""
    ids = [str(i) for i in item.metadata.get("supporting_passage_ids") or []]
    titles = [str(t) for t in item.metadata.get("supporting_titles") or []]
    if not ids:
        raise EvidenceError(f"question {item.id!r}: metadata.supporting_passage_ids is missing or empty")
    if titles and len(titles) != len(ids):
        raise EvidenceError(f"question {item.id!r}: supporting_titles and supporting_passage_ids differ in length")
    return list(zip(ids, titles or [""] * len(ids), strict=True))


def title_key(text: str) -> str:
    """A title or subject for comparison: lower case, parenthesised parts and extra spaces dropped (also how a
    query names it, bench/shown_gold.py)."""
    return " ".join(re.sub(r"\([^)]*\)", " ", text).casefold().split())


def _similarity(subject: str, title: str) -> float:
    """2.0 for the same title key, else difflib's ratio of the two keys (at most 1.0)."""
    a, b = title_key(subject), title_key(title)
    return 2.0 if a == b else difflib.SequenceMatcher(None, a, b).ratio()


def _words(text: str) -> set[str]:
    return set(re.findall(r"\w+", title_key(text)))


def match_subjects(subjects: Sequence[str], golds: Sequence[tuple[str, str]]) -> dict[str, str]:
    """Each distinct subject's gold id: the one-to-one assignment of subjects to gold titles with the most
    string similarity (pairs below 0.5 stay unassigned).

    2Wiki's triple subjects often differ from the paragraph titles: "Euphoria" vs "Euphoria (Usher
    song)", or "Charles James Mathew" vs "Charles Mathew" when another gold is "James Charles Mathew".
    """
    names = list(dict.fromkeys(subjects))
    score = {(s, g): _similarity(s, t) for s in names for g, t in golds}
    slots = [g for g, _ in golds] + [None] * len(names)  # None: the subject matches no gold paragraph
    best: tuple[float, tuple] = (-1.0, ())
    for chosen in itertools.permutations(slots, len(names)):
        if any(g is not None and score[(s, g)] < 0.5 for s, g in zip(names, chosen, strict=True)):
            continue
        total = sum(score[(s, g)] for s, g in zip(names, chosen, strict=True) if g is not None)
        if total > best[0]:
            best = (total, chosen)
    return {s: g for s, g in zip(names, best[1], strict=True) if g is not None}


def _one_per_gold(hops: list[Hop]) -> list[Hop]:
    """The first hop aimed at each gold paragraph."""
    seen: set[str] = set()
    kept = []
    for hop in hops:
        if hop.gold_id not in seen:
            seen.add(hop.gold_id)
            kept.append(hop)
    return kept


def twowiki_hops(item: QAItem) -> list[Hop]:
    triples = [[str(part) for part in triple] for triple in item.metadata.get("evidences") or []]
    gold_of = match_subjects([subject for subject, _, _ in triples], _supporting(item))
    hops = [
        Hop(f"{subject} {relation}", gold_of[subject], f"the {relation} of {subject}", f"{subject}: {relation} {obj}")
        for subject, relation, obj in triples
        if subject in gold_of
    ]
    return _one_per_gold(hops)


def decomposition_hops(item: QAItem) -> list[Hop]:
    """MuSiQue (``paragraph_support_idx`` into ``context_passage_ids``) and the world (``passage_id``)."""
    context = [str(i) for i in item.metadata.get("context_passage_ids") or []]
    answers: list[str] = []
    hops = []
    for hop in item.metadata["question_decomposition"]:

        def earlier(match: re.Match) -> str:
            number = int(match.group(1))
            return answers[number - 1] if 1 <= number <= len(answers) else match.group(0)

        query = re.sub(r"#(\d+)", earlier, str(hop["question"])).replace(" >> ", " ").strip()
        answer = str(hop.get("answer", ""))
        answers.append(answer)
        if "passage_id" in hop:
            gold = str(hop["passage_id"])
        elif hop.get("paragraph_support_idx") is not None and hop["paragraph_support_idx"] < len(context):
            gold = context[hop["paragraph_support_idx"]]
        else:
            continue
        if query:
            hops.append(Hop(query, gold, query.rstrip("?"), f"{query.rstrip('?')}: {answer}" if answer else ""))
    return _one_per_gold(hops)


def hotpotqa_hops(item: QAItem) -> list[Hop]:
    golds = _supporting(item)
    question = item.question.casefold()
    named = [(gold, title) for gold, title in golds if title and _words(title) <= _words(question)]
    kind = item.metadata.get("type") or ("comparison" if len(named) == len(golds) else "bridge")
    if kind == "comparison":
        return [Hop(title, gold, f"the facts about {title}") for gold, title in golds]
    # bridge: the question finds the paragraph it names; that paragraph names the bridge entity
    first = named[0] if named else golds[0]
    rest = [(gold, title) for gold, title in golds if gold != first[0]]
    hops = [Hop(item.question, first[0], f"the paragraph about {first[1] or 'the question'}")]
    hops += [Hop(title, gold, f"the facts about {title}, which that paragraph names") for gold, title in rest]
    return hops


def evidence_hops(item: QAItem) -> list[Hop]:
    """The item's evidence chain, from whichever annotation it carries (EvidenceError when none)."""
    metadata = item.metadata
    if metadata.get("question_decomposition"):
        hops = decomposition_hops(item)
    elif metadata.get("evidences"):
        hops = twowiki_hops(item)
    elif metadata.get("supporting_titles"):
        hops = hotpotqa_hops(item)
    else:
        raise EvidenceError(
            f"question {item.id!r} has no evidence annotation: the evidence teacher reads metadata."
            "question_decomposition (MuSiQue), evidences (2Wiki) or supporting_titles (HotpotQA)"
        )
    if not hops:
        raise EvidenceError(f"question {item.id!r}: its annotation names no hop with a gold paragraph")
    return [dataclasses.replace(hop, query=" ".join(hop.query.split())) for hop in hops]  # as a Step keeps it


OPENINGS = (
    "The question depends on several facts. I will start with {need}.",
    "To answer it I first need {need}.",
    "Nothing is retrieved yet; the first fact to look up is {need}.",
)
# the first step after documents shown with the question (env.question_docs): say what they lack
OPENINGS_AFTER_QUESTION = tuple(
    f"{QUESTION_DOCS_LACK} {rest}"
    for rest in ("{need}, so I look that up.", "{need}; I search for that first.", "{need}.")
)
# ... and when they hold part of the chain, name that part before the missing one, so that the transcripts show
# which entity is already covered (docs/results.md: SmolLM2-135M learns the sentence, not yet the skill)
OPENINGS_HOLDING_PART = tuple(
    f"{QUESTION_DOCS_LACK} part of the evidence: {rest}"
    for rest in (
        "they hold {held}, but not {need}, so I look that up.",
        "they hold {held}; still missing is {need}, which I search for first.",
        "{held} is there, {need} is not.",
    )
)
FOUND = (
    ("The documents give what I was looking for.", "Next I need {need}."),
    ("That search found the passage I needed.", "The next missing fact is {need}."),
    ("Now I have that piece of evidence.", "I still need {need}."),
)
FINAL = (
    "The documents hold every fact the question needs{facts}. The answer is {answer}.",
    "Putting the retrieved evidence together{facts}, the answer is {answer}.",
)
# after a search's documents under env.question_docs: one opening, then the decision in one word
FOUND_AFTER_QUESTION = ((SEARCH_FOUND, f"{FOUND_MORE} {{need}}."),)
FINAL_AFTER_QUESTION = (f"{SEARCH_FOUND} {FOUND_ALL} every fact it needs{{facts}}. The answer is {{answer}}.",)
# the analysis of an answer before any search: the documents shown with the question held every fact
SHOWN_WITH_QUESTION = f"{QUESTION_DOCS_HOLD} what it asks."
MISSED = "The documents for my last query do not contain what I needed, and I cannot go on from them."


def aimed_hops(
    hops: Sequence[Hop], shown_per_step: Sequence[set[str]], shown_first: Collection[str] = ()
) -> tuple[list[Hop], list[Hop]]:
    """(the hop each step aimed at, the hops still to retrieve) after steps that showed ``shown_per_step``.

    A step aims at the first hop whose gold paragraph nothing showed before it: a hop that the
    documents shown with the question (``shown_first``) or an earlier step's already answered is
    skipped, as a policy reading those documents would.
    """
    shown: set[str] = set(shown_first)
    aimed = []
    for documents in shown_per_step:
        aimed.append(next(hop for hop in hops if hop.gold_id not in shown))
        shown |= documents
    return aimed, [hop for hop in hops if hop.gold_id not in shown]


class EvidenceTeacher(PlanningTeacher):
    """Writes the annotated chain one step at a time; gives up when a step's gold paragraph was not retrieved."""

    name = "evidence"

    def plan(self, request: TeacherRequest) -> Step:
        hops = evidence_hops(request.item)
        turns = request.turns
        rng = self.rng(request)
        shown = [{doc.id for doc in turn.documents} for turn in turns]
        context = {doc.id for doc in request.context}
        aimed, remaining = aimed_hops(hops, shown, context)
        if turns and aimed[-1].gold_id not in {doc.id for doc in turns[-1].documents}:
            return Step("", answer="unknown", reflection=MISSED)  # rejected: this step's gold was not retrieved
        if not remaining:
            facts = "; ".join(hop.fact for hop in hops if hop.fact)
            answer = request.item.golden_answers[0]
            finals = FINAL_AFTER_QUESTION if request.context and turns else FINAL
            final = rng.choice(finals).format(facts=f" ({facts})" if facts else "", answer=answer)
            return Step("" if turns else SHOWN_WITH_QUESTION, answer=answer, reflection=final)
        if len(remaining) >= request.max_steps - len(turns):  # the chain does not fit the retrieval budget
            return Step("The chain of evidence is longer than the steps I may take.", answer="unknown")
        hop = remaining[0]
        if not turns:
            held = " and ".join(done.fact or done.need for done in hops if done.gold_id in context)
            openings = OPENINGS_HOLDING_PART if held else OPENINGS_AFTER_QUESTION if request.context else OPENINGS
            return Step(rng.choice(openings).format(held=held, need=hop.need), query=hop.query)
        reflection, plan = rng.choice(FOUND_AFTER_QUESTION if request.context else FOUND)
        return Step(plan.format(need=hop.need), query=hop.query, reflection=reflection)
