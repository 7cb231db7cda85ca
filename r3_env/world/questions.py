"""Multi-hop questions over the world, modelled on 2WikiMultihopQA and HotpotQA.

Types (2Wiki's names): ``compositional`` (a chain of 2-4 facts), ``comparison`` (one fact of two
entities, compared), ``inference`` (a family relation composed from two, e.g. paternal
grandfather), ``bridge_comparison`` (a comparison through a bridge entity each, e.g. which
film's director was born first). Every question records its gold passages and its gold
decomposition: the single-hop sub-questions with their answers and the passage that states each.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from r3_env.data import QAItem
from r3_env.world.graph import CITY, FILM, ORG, PERSON, Entity, World
from r3_env.world.passages import date_answers

QUESTION_TYPES = ("compositional", "comparison", "inference", "bridge_comparison")


@dataclass(frozen=True)
class Fact:
    """One kind of single-hop fact about an entity kind.

    ``link`` names the Entity field holding a linked entity (facts that can continue a chain);
    ``phrases`` turn a reference into a noun phrase for the linked entity ("the director of X").
    """

    kind: str
    relation: str
    questions: tuple[str, ...]
    answer_kind: str
    link: str | None = None
    phrases: tuple[str, ...] = ()


FACTS: dict[str, tuple[Fact, ...]] = {
    PERSON: (
        Fact(
            PERSON,
            "place of birth",
            ("Where was {ref} born?", "In which city was {ref} born?"),
            "place",
            "birthplace",
            ("the birthplace of {ref}", "the city where {ref} was born"),
        ),
        Fact(
            PERSON,
            "father",
            ("Who is the father of {ref}?", "Who was the father of {ref}?"),
            "person",
            "father",
            ("the father of {ref}",),
        ),
        Fact(
            PERSON,
            "spouse",
            ("Who was {ref} married to?", "Who is the spouse of {ref}?"),
            "person",
            "spouse",
            ("the spouse of {ref}", "the person {ref} married"),
        ),
        Fact(
            PERSON,
            "employer",
            ("Which organisation did {ref} work for?", "Who employed {ref}?"),
            "organisation",
            "employer",
            ("the employer of {ref}", "the organisation {ref} worked for"),
        ),
        Fact(PERSON, "date of birth", ("When was {ref} born?", "What is the date of birth of {ref}?"), "date"),
        Fact(PERSON, "date of death", ("When did {ref} die?", "What is the date of death of {ref}?"), "date"),
        Fact(PERSON, "nationality", ("What nationality is {ref}?", "What is the nationality of {ref}?"), "nationality"),
        Fact(
            PERSON, "occupation", ("What was the occupation of {ref}?", "What did {ref} do for a living?"), "occupation"
        ),
    ),
    FILM: (
        Fact(
            FILM,
            "director",
            ("Who directed {ref}?", "Who is the director of {ref}?"),
            "person",
            "director",
            ("the director of {ref}",),
        ),
        Fact(
            FILM,
            "cast member",
            ("Who starred in {ref}?", "Who played the lead role in {ref}?"),
            "person",
            "lead",
            ("the lead actor of {ref}", "the star of {ref}"),
        ),
        Fact(
            FILM,
            "production company",
            ("Which company produced {ref}?", "Which studio made {ref}?"),
            "organisation",
            "company",
            ("the company that produced {ref}", "the production company of {ref}"),
        ),
        Fact(FILM, "publication date", ("In which year was {ref} released?", "When did {ref} come out?"), "year"),
        Fact(FILM, "genre", ("What genre is {ref}?", "What kind of film is {ref}?"), "genre"),
    ),
    ORG: (
        Fact(
            ORG,
            "founded by",
            ("Who founded {ref}?", "Who is the founder of {ref}?"),
            "person",
            "founder",
            ("the founder of {ref}",),
        ),
        Fact(
            ORG,
            "headquarters location",
            ("In which city is {ref} headquartered?", "Where is {ref} based?"),
            "place",
            "headquarters",
            ("the city where {ref} is headquartered", "the home city of {ref}"),
        ),
        Fact(ORG, "inception", ("In which year was {ref} founded?", "When was {ref} established?"), "year"),
    ),
    CITY: (
        Fact(CITY, "country", ("In which country is {ref}?", "Which country is {ref} located in?"), "country"),
        Fact(CITY, "inception", ("In which year was {ref} founded?", "When was {ref} established?"), "year"),
    ),
}


@dataclass(frozen=True)
class Hop:
    """One single-hop sub-question, its answer and the entity whose passage states it."""

    question: str
    answer: str
    entity: int
    evidence: tuple[str, str, str]


@dataclass
class Question:
    text: str
    answers: list[str]
    type: str
    answer_kind: str
    hops: list[Hop] = field(default_factory=list)

    @property
    def signature(self) -> tuple:
        """What the question means: type, gold passages and answers (paraphrases share it)."""
        return self.type, frozenset(h.entity for h in self.hops), tuple(self.answers)

    def to_item(self, world: World, item_id: str) -> QAItem:
        gold = list(dict.fromkeys(str(h.entity) for h in self.hops))
        return QAItem(
            id=item_id,
            question=self.text,
            golden_answers=self.answers,
            metadata={
                "type": self.type,
                "hops": len(self.hops),
                "answer_kind": self.answer_kind,
                "supporting_passage_ids": gold,
                "supporting_titles": [world.entities[int(g)].title for g in gold],
                "question_decomposition": [
                    {"question": h.question, "answer": h.answer, "passage_id": str(h.entity)} for h in self.hops
                ],
                "evidences": [list(h.evidence) for h in self.hops],
            },
        )


def _capitalise(text: str) -> str:
    return text[0].upper() + text[1:]


class QuestionMaker:
    """Samples questions of every type from a world with its own random stream."""

    def __init__(self, world: World, rng: random.Random) -> None:
        self.world = world
        self.rng = rng
        self.by_kind = {PERSON: world.person_ids, FILM: world.film_ids, ORG: world.org_ids, CITY: world.city_ids}
        self.dead = [i for i in world.person_ids if world.entities[i].death]
        self._pools: dict[tuple[str, str, bool], list[int]] = {}

    # -- facts ----------------------------------------------------------------------------------

    def ref(self, entity: Entity) -> str:
        """How a question names an entity; a shared name gets the qualifier that tells it apart."""
        if entity.kind == FILM:
            if entity.qualifier:
                return f"the {entity.year} film {entity.name}"
            return entity.name if self.rng.random() < 0.6 else f"the film {entity.name}"
        return entity.title

    def target(self, entity: Entity, fact: Fact) -> Entity | None:
        value = getattr(entity, fact.link) if fact.link else None
        return self.world.entities[value] if value is not None else None

    def answer(self, entity: Entity, fact: Fact) -> list[str] | None:
        """Gold answers of a fact, or None when the entity lacks it."""
        w = self.world
        if fact.link:
            target = self.target(entity, fact)
            return [target.name] if target is not None else None
        if fact.relation == "date of birth":
            return date_answers(entity.birth)
        if fact.relation == "date of death":
            return date_answers(entity.death) if entity.death else None
        if fact.relation == "nationality":
            return [w.demonym(entity.nationality), w.country_name(entity.nationality)]
        if fact.relation == "occupation":
            return [entity.occupation]
        if fact.relation in ("publication date", "inception"):
            return [str(entity.year)]
        if fact.relation == "genre":
            return [entity.genre]
        if fact.relation == "country":
            return [w.country_name(entity.country)]
        raise ValueError(f"no answer rule for fact {fact.relation!r}")

    def hop(self, entity: Entity, fact: Fact, answers: list[str]) -> Hop:
        question = _capitalise(self.rng.choice(fact.questions).format(ref=self.ref(entity)))
        return Hop(question, answers[0], entity.idx, (entity.name, fact.relation, answers[0]))

    def fact(self, kind: str, relation: str) -> Fact:
        return next(f for f in FACTS[kind] if f.relation == relation)

    # -- question types -------------------------------------------------------------------------

    def compositional(self, hops: int) -> Question | None:
        rng = self.rng
        kind = rng.choice((PERSON, PERSON, FILM, FILM, ORG))
        start = self.world.entities[rng.choice(self.by_kind[kind])]
        chain, links = [start], []
        for _ in range(hops - 1):
            options = [
                (f, t)
                for f in FACTS[chain[-1].kind]
                if f.link
                for t in [self.target(chain[-1], f)]
                if t is not None and t not in chain
            ]
            if not options:
                return None
            fact, target = rng.choice(options)
            links.append(fact)
            chain.append(target)
        last = chain[-1]
        finals = [
            f
            for f in FACTS[last.kind]
            if self.answer(last, f) is not None and (f.link is None or self.target(last, f) not in chain)
        ]
        if not finals:
            return None
        final = rng.choice(finals)
        answers = self.answer(last, final)
        ref = self.ref(start)
        steps = []
        for entity, fact in zip(chain, links, strict=False):
            steps.append(self.hop(entity, fact, self.answer(entity, fact)))
            ref = rng.choice(fact.phrases).format(ref=ref)
        steps.append(self.hop(last, final, answers))
        text = _capitalise(rng.choice(final.questions).format(ref=ref))
        return Question(text, answers, "compositional", final.answer_kind, steps)

    def _pair(
        self,
        kind: str,
        key: Callable[[Entity], object] | None = None,
        pool: list[int] | None = None,
        same: Callable[[Entity], object] | None = None,
        through: Callable[[Entity], Entity] | None = None,
    ) -> tuple[Entity, Entity] | None:
        """Two entities with different names (and different bridge entities ``through``).

        With ``key`` the two differ in it (no ties to compare); with ``same`` they share it half
        the time, so yes/no questions are balanced.
        """
        ids = pool if pool is not None else self.by_kind[kind]
        if len(ids) < 2:
            return None
        entities = self.world.entities

        def apart(a: Entity, b: Entity) -> bool:
            return a.name != b.name and (through is None or through(a).idx != through(b).idx)

        for _ in range(20):
            a, b = (entities[i] for i in self.rng.sample(ids, 2))
            if not apart(a, b) or (key is not None and key(a) == key(b)):
                continue
            if same is not None and self.rng.random() < 0.5:
                twins = [
                    entities[i]
                    for i in self.rng.sample(ids, min(len(ids), 60))
                    if same(entities[i]) == same(a) and apart(a, entities[i])
                ]
                if not twins:
                    continue
                b = twins[0]
            return a, b
        return None

    def comparison(self) -> Question | None:
        rng = self.rng
        choice = rng.choice(("born", "born", "died", "nationality", "film", "film", "organisation", "city", "country"))
        if choice in ("born", "died"):
            dead = choice == "died"
            date = (lambda e: e.death) if dead else (lambda e: e.birth)
            pair = self._pair(PERSON, key=date, pool=self.dead if dead else None)
            if pair is None:
                return None
            a, b = pair
            first = rng.random() < 0.5
            winner = min(pair, key=date) if first else max(pair, key=date)
            text = rng.choice(
                {
                    (False, True): ("Who was born first, {a} or {b}?", "Which person was born earlier, {a} or {b}?"),
                    (False, False): ("Who was born later, {a} or {b}?", "Who is younger, {a} or {b}?"),
                    (True, True): ("Who died first, {a} or {b}?", "Which person died earlier, {a} or {b}?"),
                    (True, False): ("Who died later, {a} or {b}?", "Which person died more recently, {a} or {b}?"),
                }[(dead, first)]
            )
            fact = self.fact(PERSON, "date of death" if dead else "date of birth")
            hops = [self.hop(e, fact, self.answer(e, fact)) for e in pair]
            return Question(text.format(a=self.ref(a), b=self.ref(b)), [winner.name], "comparison", "person", hops)
        if choice in ("nationality", "country"):
            kind, relation = (PERSON, "nationality") if choice == "nationality" else (CITY, "country")
            attribute = (lambda e: e.nationality) if kind == PERSON else (lambda e: e.country)
            pair = self._pair(kind, same=attribute)
            if pair is None:
                return None
            a, b = pair
            text = (
                rng.choice(("Are {a} and {b} of the same nationality?", "Do {a} and {b} share a nationality?"))
                if kind == PERSON
                else rng.choice(
                    ("Are {a} and {b} in the same country?", "Are {a} and {b} located in the same country?")
                )
            )
            fact = self.fact(kind, relation)
            hops = [self.hop(e, fact, self.answer(e, fact)) for e in pair]
            verdict = "yes" if attribute(a) == attribute(b) else "no"
            return Question(text.format(a=self.ref(a), b=self.ref(b)), [verdict], "comparison", "yes/no", hops)
        kind = {"film": FILM, "organisation": ORG, "city": CITY}[choice]
        answer_kind = {FILM: "film", ORG: "organisation", CITY: "place"}[kind]
        pair = self._pair(kind, key=lambda e: e.year)
        if pair is None:
            return None
        a, b = pair
        first = rng.random() < 0.5
        winner = min(pair, key=lambda e: e.year) if first else max(pair, key=lambda e: e.year)
        text = {
            FILM: ("Which film came out first, {a} or {b}?", "Which film was released more recently, {a} or {b}?"),
            ORG: ("Which organisation was founded first, {a} or {b}?", "Which organisation is younger, {a} or {b}?"),
            CITY: ("Which city was founded earlier, {a} or {b}?", "Which city was founded more recently, {a} or {b}?"),
        }[kind][0 if first else 1]
        fact = self.fact(kind, "publication date" if kind == FILM else "inception")
        hops = [self.hop(e, fact, self.answer(e, fact)) for e in pair]
        return Question(text.format(a=self.ref(a), b=self.ref(b)), [winner.name], "comparison", answer_kind, hops)

    def inference(self) -> Question | None:
        rng, w = self.rng, self.world
        relation = rng.choice(("grandfather", "father-in-law"))
        first_fact = self.fact(PERSON, "father" if relation == "grandfather" else "spouse")
        father = self.fact(PERSON, "father")
        for _ in range(30):
            person = w.entities[rng.choice(w.person_ids)]
            middle = self.target(person, first_fact)
            if middle is None or middle.father is None or middle.father == person.idx:
                continue
            top = w.entities[middle.father]
            text = rng.choice(
                ("Who is the paternal grandfather of {x}?", "Who was the father of the father of {x}?")
                if relation == "grandfather"
                else ("Who is the father-in-law of {x}?", "Who was the father of the spouse of {x}?")
            )
            hops = [self.hop(person, first_fact, [middle.name]), self.hop(middle, father, [top.name])]
            return Question(text.format(x=self.ref(person)), [top.name], "inference", "person", hops)
        return None

    def _bridge_pool(self, kind: str, bridge_fact: Fact, needs_death: bool) -> list[int]:
        """Entities of ``kind`` whose bridge person exists (and has died, if asked); cached."""
        key = (kind, bridge_fact.relation, needs_death)
        if key not in self._pools:
            self._pools[key] = [
                i
                for i in self.by_kind[kind]
                for person in [self.target(self.world.entities[i], bridge_fact)]
                if person is not None and (person.death or not needs_death)
            ]
        return self._pools[key]

    def bridge_comparison(self) -> Question | None:
        rng = self.rng
        kind, bridge = rng.choice(((FILM, "director"), (FILM, "director"), (FILM, "cast member"), (ORG, "founded by")))
        bridge_fact = self.fact(kind, bridge)
        attribute = rng.choice(("born", "born", "died", "nationality"))
        pool = self._bridge_pool(kind, bridge_fact, attribute == "died")

        def person_of(entity: Entity) -> Entity:
            return self.target(entity, bridge_fact)

        if attribute == "nationality":
            pair = self._pair(kind, pool=pool, same=lambda e: person_of(e).nationality, through=person_of)
        else:
            date = (lambda e: person_of(e).death) if attribute == "died" else (lambda e: person_of(e).birth)
            pair = self._pair(kind, pool=pool, key=date, through=person_of)
        if pair is None:
            return None
        a, b = pair
        pa, pb = person_of(a), person_of(b)
        noun = {"director": "director", "cast member": "lead actor", "founded by": "founder"}[bridge]
        thing = "film" if kind == FILM else "organisation"
        if attribute == "nationality":
            text = rng.choice(
                (
                    f"Are the {noun}s of {{a}} and {{b}} of the same nationality?",
                    f"Do the {noun}s of {{a}} and {{b}} share a nationality?",
                )
            )
            answers, answer_kind = ["yes" if pa.nationality == pb.nationality else "no"], "yes/no"
            fact = self.fact(PERSON, "nationality")
        else:
            first = rng.random() < 0.5
            winner = min(pair, key=date) if first else max(pair, key=date)
            verb = "died" if attribute == "died" else "was born"
            text = rng.choice(
                (
                    f"Which {thing} has the {noun} who {verb} {'first' if first else 'later'}, {{a}} or {{b}}?",
                    f"Which {thing}'s {noun} {verb} {'earlier' if first else 'later'}, {{a}} or {{b}}?",
                )
            )
            answers, answer_kind = [winner.name], "film" if kind == FILM else "organisation"
            fact = self.fact(PERSON, "date of death" if attribute == "died" else "date of birth")
        hops = [
            self.hop(a, bridge_fact, [pa.name]),
            self.hop(b, bridge_fact, [pb.name]),
            self.hop(pa, fact, self.answer(pa, fact)),
            self.hop(pb, fact, self.answer(pb, fact)),
        ]
        return Question(text.format(a=self.ref(a), b=self.ref(b)), answers, "bridge_comparison", answer_kind, hops)

    def sample(self, question_type: str) -> Question | None:
        if question_type == "compositional":
            return self.compositional(self.rng.choices((2, 3, 4), weights=(0.55, 0.3, 0.15))[0])
        return getattr(self, question_type)()


def generate_questions(
    world: World, count: int, mix: dict[str, float], seed_tag: str, exclude: set[tuple] | None = None
) -> Iterator[Question]:
    """Yield ``count`` questions distinct in meaning (and from the signatures in ``exclude``).

    Two questions mean the same when they have the same type, gold passages and answers (a
    paraphrase, or the same comparison with its sides swapped). Raises ValueError when the world
    has no room for ``count`` more, so the caller can name the setting to change.
    """
    maker = QuestionMaker(world, random.Random(f"questions:{world.seed}:{seed_tag}"))
    seen = set(exclude or ())
    types, weights = zip(*mix.items(), strict=True)
    made = misses = 0
    while made < count:
        question = maker.sample(maker.rng.choices(types, weights=weights)[0])
        if question is None or question.signature in seen:
            misses += 1
            if misses > 5000:  # thousands of draws in a row found nothing new: the world is exhausted
                raise ValueError(
                    f"this world holds only {made} more distinct {seed_tag} questions of the mix "
                    f"{', '.join(f'{t}={w:g}' for t, w in mix.items())}, not {count}: lower the question count "
                    "or raise --entities"
                )
            continue
        misses = 0
        seen.add(question.signature)
        made += 1
        yield question
