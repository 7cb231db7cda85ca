"""A scripted teacher for the synthetic world: it follows each question's gold decomposition.

It reads what a careful annotator would: the question's single-hop sub-questions
(``metadata.question_decomposition``, with the passage stating each answer) and the documents
actually shown so far. Each step it

- queries for the first sub-question whose passage has not been shown yet, in one of several
  wordings (the sub-question itself, "subject relation", "relation of subject");
- rephrases when the documents missed it;
- answers once every passage stating a needed fact has been shown, combining the facts.

A share of trajectories (``detour_rate``) start with the whole question as the query, which is too
broad; the next step says so and splits it, as in the paper's case study. The teacher only answers
from what was retrieved: when the step budget runs out first it answers "unknown", and rejection
sampling drops the trajectory. Its acceptance rate therefore measures whether the world's questions can be
solved step by step with the configured retriever, not a copy of the gold answer.
"""

from __future__ import annotations

import random
import zlib
from dataclasses import dataclass

from r3_env.coldstart.teacher import QUESTION_DOCS_HOLD, QUESTION_DOCS_LACK, PlanningTeacher, TeacherRequest
from r3_env.protocol import Step

# How the world's relation names read in a sentence ("the founder of X", not "the founded by of X").
NOUNS = {
    "place of birth": "birthplace",
    "cast member": "lead actor",
    "production company": "production company",
    "publication date": "release year",
    "founded by": "founder",
    "headquarters location": "headquarters",
    "inception": "founding year",
}


@dataclass(frozen=True)
class SubQuestion:
    question: str
    answer: str
    passage_id: str
    subject: str
    relation: str

    @property
    def noun(self) -> str:
        return NOUNS.get(self.relation, self.relation)

    def queries(self) -> list[str]:
        """Wordings of a query for this fact, the sub-question first."""
        return [self.question, f"{self.subject} {self.noun}", f"{self.noun} of {self.subject}"]


OPENINGS = (
    "The question needs several facts that depend on each other. The first one I need is: {sub}",
    "To answer this I have to break the question into simpler parts. I will start with: {sub}",
    "Nothing has been retrieved yet. The first missing piece of information is: {sub}",
)
# the first step after documents shown with the question (env.question_docs): say what they lack
OPENINGS_AFTER_QUESTION = tuple(
    f"{QUESTION_DOCS_LACK} {rest}"
    for rest in ("this part: {sub}", "the first missing piece of information: {sub}", "one fact still: {sub}")
)
BROAD = (
    "The question involves several facts; let me first search for it as a whole.",
    "I will begin with a search for the whole question and see what it returns.",
)
# After documents, a step says what they told (its reflection), then what it does next (its analysis);
# a format without a reflection section reads them as one analysis (StepFormat.express).
AFTER_BROAD = (
    (
        "The documents for my last query do not answer it as a whole: that query was too broad.",
        "I will split it and first ask: {sub}",
    ),
    (
        "The last search was too broad; its documents do not match the question directly.",
        "Splitting it, the first piece I need is: {sub}",
    ),
)
FOUND = (
    ("The documents state that the {relation} of {subject} is {answer}.", "Next I need: {sub}"),
    ("From the retrieved passage about {subject}: {relation} is {answer}.", "The remaining missing piece is: {sub}"),
    ("Now I know that {answer} is the {relation} of {subject}.", "I still need: {sub}"),
)
MISSED = (
    ("None of the documents gives the {relation} of {subject}.", "I will rephrase the query."),
    ("The retrieved documents do not mention the {relation} of {subject};", "let me search with different words."),
)
NOT_FOUND = ("The documents do not hold what I need yet.", "The retrieved documents are not about it.")
# the analysis of an answer before any search: the documents shown with the question held every fact
SHOWN_WITH_QUESTION = f"{QUESTION_DOCS_HOLD} every fact I need."
FINAL = (
    "I now have every piece: {facts}. Therefore the answer is {answer}.",
    "Combining the evidence ({facts}), the answer to the question is {answer}.",
    "From the documents: {facts}. So the answer is {answer}.",
)
GIVE_UP = (
    "I could not find the {missing} in the documents, and another search would not be shown to me. "
    "I cannot determine the answer.",
)


def decomposition(request: TeacherRequest) -> list[SubQuestion]:
    """The item's gold sub-questions; ValueError naming the field when it has none."""
    metadata = request.item.metadata
    hops = metadata.get("question_decomposition")
    if not isinstance(hops, list) or not hops:
        raise ValueError(
            f"question {request.item.id!r}: the scripted teacher follows metadata.question_decomposition "
            "(the synthetic world writes it); this dataset has none, so use --teacher.kind openai"
        )
    evidences = metadata.get("evidences") or []
    subs = []
    for index, hop in enumerate(hops):
        evidence = evidences[index] if index < len(evidences) else ["", "", ""]
        subs.append(
            SubQuestion(
                str(hop["question"]), str(hop["answer"]), str(hop["passage_id"]), str(evidence[0]), str(evidence[1])
            )
        )
    return subs


class ScriptedTeacher(PlanningTeacher):
    name = "scripted"

    def plan(self, request: TeacherRequest) -> Step:
        subs = decomposition(request)
        turns = request.turns
        rng = self.rng(request)
        detour = random.Random(zlib.crc32(f"{self.config.seed}/{request.item.id}/{request.sample}".encode()))
        # what the question's own retrieval showed (env.question_docs) counts as found, as a policy would read it
        shown = {doc.id for doc in request.context} | {doc.id for turn in turns for doc in turn.documents}
        missing = [sub for sub in subs if sub.passage_id not in shown]
        queries_left = request.max_steps - len(turns)

        broad = not turns and not request.context and len(subs) + 1 < request.max_steps  # the question unsearched
        if broad and detour.random() < self.config.detour_rate:
            return Step(rng.choice(BROAD), query=request.item.question)
        if not missing:
            facts = "; ".join(f"the {s.noun} of {s.subject} is {s.answer}" for s in subs)
            answer = request.item.golden_answers[0]
            final = rng.choice(FINAL).format(facts=facts, answer=answer)
            return Step("" if turns else SHOWN_WITH_QUESTION, answer=answer, reflection=final)
        target = missing[0]
        if queries_left <= 1:  # another query would end the episode before its documents are shown
            missing_fact = f"{target.noun} of {target.subject}"
            plan = "" if turns else "The step budget leaves no room for a search."  # the no-retrieval shape thinks
            return Step(plan, answer="unknown", reflection=rng.choice(GIVE_UP).format(missing=missing_fact))

        asked = [turn.step.query for turn in turns]
        wordings = target.queries()
        tried = [q for q in wordings if q in asked]
        fresh = [q for q in wordings if q not in asked]
        query = fresh[0] if not tried else rng.choice(fresh or wordings)
        if not turns:
            openings = OPENINGS_AFTER_QUESTION if request.context else OPENINGS
            return Step(rng.choice(openings).format(sub=target.question), query=query)
        if turns[-1].step.query == request.item.question:
            reflection, plan = rng.choice(AFTER_BROAD)
            return Step(plan.format(sub=target.question), query=query, reflection=reflection)
        if tried:
            reflection, plan = rng.choice(MISSED)
            return Step(plan, query=query, reflection=reflection.format(relation=target.noun, subject=target.subject))
        last_shown = {doc.id for doc in turns[-1].documents}
        found = [s for s in subs if s.passage_id in last_shown]
        if not found:
            return Step(rng.choice(OPENINGS).format(sub=target.question), query=query, reflection=rng.choice(NOT_FOUND))
        # what the last query was after, when it was found; else whatever else it turned up
        found.sort(key=lambda s: turns[-1].step.query not in s.queries())
        reflection, plan = rng.choice(FOUND)
        fact = found[0]
        return Step(
            plan.format(sub=target.question),
            query=query,
            reflection=reflection.format(relation=fact.noun, subject=fact.subject, answer=fact.answer),
        )
