"""The entity graph of the synthetic world: people, films, cities and organisations, and their links.

Built deterministically from a seed. Links respect time (a father is 20-50 years older than his
child, a founder is an adult when the organisation is founded, a film's director is an adult in
its release year), so comparison questions have consistent answers. Distractors are part of the
graph: namesakes and remakes share a name with another entity; siblings, sequels, subsidiaries
and twin towns are near-duplicates that share most facts with the entity they copy.
"""

from __future__ import annotations

import bisect
import logging
import random
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from r3_env.world import names as N

logger = logging.getLogger(__name__)

PERSON, FILM, CITY, ORG = "person", "film", "city", "organisation"


@dataclass(slots=True)
class Entity:
    """One entity; its passage id is ``str(idx)``. Unused fields stay None for other kinds."""

    idx: int
    kind: str
    name: str
    qualifier: str = ""  # what tells a shared name apart ("painter", "1987 film"); empty when unique

    variant_of: int | None = None
    variant: str | None = None  # namesake, remake, sibling, sequel, subsidiary, twin town
    # people
    gender: str = ""
    occupation: str = ""
    birth: tuple[int, int, int] | None = None
    death: tuple[int, int, int] | None = None
    birthplace: int | None = None
    nationality: int | None = None
    father: int | None = None
    spouse: int | None = None
    employer: int | None = None
    # films
    year: int | None = None  # release year, or founding year of a city or organisation
    genre: str = ""
    director: int | None = None
    lead: int | None = None
    company: int | None = None
    # cities and organisations
    country: int | None = None
    population: int | None = None
    org_kind: str = ""
    founder: int | None = None
    headquarters: int | None = None
    # reverse links, filled by World.link()
    directed: list[int] = field(default_factory=list)
    starred: list[int] = field(default_factory=list)
    founded: list[int] = field(default_factory=list)
    natives: list[int] = field(default_factory=list)
    children: list[int] = field(default_factory=list)
    employees: list[int] = field(default_factory=list)
    based_here: list[int] = field(default_factory=list)

    @property
    def title(self) -> str:
        """The passage title: the name, with its qualifier in parentheses when the name is shared."""
        return f"{self.name} ({self.qualifier})" if self.qualifier else self.name

    productions: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class WorldSizes:
    cities: int
    organisations: int
    films: int
    people: int

    @classmethod
    def for_total(cls, entities: int) -> WorldSizes:
        cities = max(4, round(entities * 0.08))
        organisations = max(6, round(entities * 0.17))
        films = max(12, round(entities * 0.30))
        return cls(cities, organisations, films, entities - cities - organisations - films)


class _ByYear:
    """People indexed by birth year, for 'someone born between y0 and y1' draws.

    Entries must be added in non-decreasing year order (people are created in birth order).
    """

    def __init__(self) -> None:
        self.years: list[int] = []
        self.ids: list[int] = []

    def add(self, year: int, idx: int) -> None:
        self.years.append(year)
        self.ids.append(idx)

    def pick(self, rng: random.Random, lo: int, hi: int) -> int | None:
        start, stop = bisect.bisect_left(self.years, lo), bisect.bisect_right(self.years, hi)
        return self.ids[rng.randrange(start, stop)] if stop > start else None


class World:
    """The entity graph. ``entities[i]`` is the entity whose passage id is ``str(i)``."""

    def __init__(self, entities: int, seed: int, same_name_rate: float = 0.06, near_duplicate_rate: float = 0.12):
        if entities < 100:
            raise ValueError(
                f"entities must be at least 100 (got {entities}): smaller worlds cannot hold every question type"
            )
        self.seed = seed
        self.sizes = WorldSizes.for_total(entities)
        self.same_name_rate = same_name_rate
        self.near_duplicate_rate = near_duplicate_rate
        self.countries = N.COUNTRIES[: max(4, min(len(N.COUNTRIES), self.sizes.cities // 4))]
        self.rng = random.Random(f"world:{seed}")
        self.entities: list[Entity] = []
        self._build()

    # -- construction ---------------------------------------------------------------------------

    def _new(self, kind: str, name: str) -> Entity:
        entity = Entity(idx=len(self.entities), kind=kind, name=name)
        self.entities.append(entity)
        return entity

    def _variant(self) -> bool:
        return self.rng.random() < self.near_duplicate_rate

    def _build(self) -> None:
        rng, sizes = self.rng, self.sizes
        for label, step in (
            (f"{sizes.cities:,} cities", self._build_cities),
            (f"{sizes.people:,} people", self._build_people),
            (f"{sizes.organisations:,} organisations", self._build_organisations),
            ("employers", self._assign_employers),
            (f"{sizes.films:,} films", self._build_films),
            ("shuffle", self._shuffle),
        ):
            started = time.perf_counter()
            step(rng)
            logger.info("world graph: %s (%.1f s)", label, time.perf_counter() - started)
        self._link()
        self._disambiguate()

    def _build_cities(self, rng: random.Random) -> None:
        used: set[str] = set()
        self.city_ids: list[int] = []
        for _ in range(self.sizes.cities):
            base = self.entities[rng.choice(self.city_ids)] if self.city_ids and self._variant() else None
            if base is not None:  # a twin town beside an existing one
                core = N.city_core(base.name)
                name = N.unique(lambda r, b=core: f"{r.choice(N.TWIN_PREFIXES)} {b}", rng, used)
                city = self._new(CITY, name)
                city.variant_of, city.variant = base.idx, "twin town"
                city.country = base.country
                city.year = min(1950, (base.year or 1200) + rng.randint(20, 300))
            else:
                city = self._new(CITY, N.unique(N.make_city_name, rng, used))
                city.country = rng.randrange(len(self.countries))
                city.year = rng.randint(700, 1900)
            city.population = int(10 ** rng.uniform(3.7, 6.7)) // 100 * 100
            self.city_ids.append(city.idx)

    def _build_people(self, rng: random.Random) -> None:
        n = self.sizes.people
        births = sorted((rng.randint(1800, 1995), rng.randint(1, 12), rng.randint(1, 28)) for _ in range(n))
        roles = [N.DIRECTOR] * max(2, n // 9) + [N.ACTOR] * max(2, n // 8) + [N.ENTREPRENEUR] * max(2, n // 12)
        roles += [""] * (n - len(roles))
        rng.shuffle(roles)
        used_names: set[str] = set()
        self._namesake_keys: dict[str, set[tuple[str, int]]] = defaultdict(set)
        self.people_by_year = _ByYear()
        self.men_by_year = _ByYear()
        self.person_ids: list[int] = []
        unmarried: _ByYear = _ByYear()
        for birth, role in zip(births, roles, strict=True):
            year = birth[0]
            gender = rng.choice("mf")
            first_names = N.FIRST_NAMES_MALE if gender == "m" else N.FIRST_NAMES_FEMALE
            person = self._new(PERSON, "")
            person.gender, person.birth = gender, birth
            person.occupation = role or rng.choice(N.OCCUPATIONS)
            if role == N.ACTOR and gender == "f":
                person.occupation = "actress"
            if year < 1935 or rng.random() < 0.3:
                death_year = min(2024, year + rng.randint(28, 96))
                person.death = (death_year, rng.randint(1, 12), rng.randint(1, 28))
            sibling = self._pick_sibling(rng, year) if self._variant() else None
            surname = None
            if sibling is not None:
                person.variant_of, person.variant = sibling.idx, "sibling"
                person.father, person.birthplace = sibling.father, sibling.birthplace
                person.nationality = sibling.nationality
                surname = sibling.name.split(" ", 1)[1]
            else:
                person.birthplace = rng.choice(self.city_ids)
                home = self.entities[person.birthplace].country
                person.nationality = home if rng.random() < 0.9 else rng.randrange(len(self.countries))
                if rng.random() < 0.55:
                    person.father = self.men_by_year.pick(rng, year - 50, year - 20)
                    if person.father is not None:
                        surname = self.entities[person.father].name.split(" ", 1)[1]
            namesake = None
            if person.father is None and self.person_ids and rng.random() < self.same_name_rate:
                namesake = self.entities[rng.choice(self.person_ids)]
                # a namesake must stay distinguishable by occupation and birth year
                if namesake.gender != gender or (person.occupation, year) in self._namesake_keys[namesake.name]:
                    namesake = None
            if namesake is not None:
                person.name, person.variant_of, person.variant = namesake.name, namesake.idx, "namesake"
            elif surname is not None:
                person.name = N.unique(lambda r, s=surname, f=first_names: f"{r.choice(f)} {s}", rng, used_names)
            else:
                person.name = N.unique(lambda r, f=first_names: f"{r.choice(f)} {N.make_surname(r)}", rng, used_names)
            used_names.add(person.name)
            self._namesake_keys[person.name].add((person.occupation, year))
            if rng.random() < 0.5:
                partner = self._pick_partner(rng, unmarried, person)
                if partner is not None:
                    person.spouse, self.entities[partner].spouse = partner, person.idx
                else:
                    unmarried.add(year, person.idx)
            self.people_by_year.add(year, person.idx)
            if gender == "m":
                self.men_by_year.add(year, person.idx)
            self.person_ids.append(person.idx)

    def _pick_sibling(self, rng: random.Random, year: int) -> Entity | None:
        # people are created in birth order, so recent entries are the right age for a sibling
        ids = self.people_by_year.ids
        start = bisect.bisect_left(self.people_by_year.years, year - 10)
        for _ in range(4):
            if start == len(ids):
                return None
            candidate = self.entities[ids[start + rng.randrange(len(ids) - start)]]
            if candidate.father is None or candidate.variant == "namesake":
                continue
            if 20 <= year - self.entities[candidate.father].birth[0] <= 50:  # the father fits this child too
                return candidate
        return None

    def _pick_partner(self, rng: random.Random, unmarried: _ByYear, person: Entity) -> int | None:
        start = bisect.bisect_left(unmarried.years, person.birth[0] - 8)
        for _ in range(6):
            if start == len(unmarried.ids):
                return None
            position = start + rng.randrange(len(unmarried.ids) - start)
            other = self.entities[unmarried.ids[position]]
            if other.spouse is None and other.gender != person.gender and other.father != person.father:
                del unmarried.ids[position], unmarried.years[position]
                return other.idx
        return None

    def _build_organisations(self, rng: random.Random) -> None:
        used: set[str] = set()
        self.org_ids: list[int] = []
        entrepreneurs = _ByYear()
        for idx in self.person_ids:
            if self.entities[idx].occupation == N.ENTREPRENEUR:
                entrepreneurs.add(self.entities[idx].birth[0], idx)
        for _ in range(self.sizes.organisations):
            base = self.entities[rng.choice(self.org_ids)] if self.org_ids and self._variant() else None
            if base is not None:  # a subsidiary sharing the parent's name, founder and city
                kind = rng.choice(N.ORG_KINDS)
                head = base.name.rsplit(" ", 1)[0] if " " in base.name else base.name
                name = N.unique(lambda r, h=head, k=kind: f"{h} {r.choice(N._ORG_SUFFIX_BY_KIND[k])}", rng, used)
                org = self._new(ORG, name)
                org.variant_of, org.variant, org.org_kind = base.idx, "subsidiary", kind
                org.year = min(2020, (base.year or 1900) + rng.randint(1, 25))
                org.founder, org.headquarters = base.founder, base.headquarters
            else:
                kind = "film studio" if rng.random() < 0.25 else rng.choice(N.ORG_KINDS)
                org = self._new(ORG, N.unique(lambda r, k=kind: N.make_org_name(r, k), rng, used))
                org.org_kind = kind
                org.year = rng.randint(1790, 2015)
                org.founder = entrepreneurs.pick(rng, org.year - 65, org.year - 22) or self.people_by_year.pick(
                    rng, org.year - 65, org.year - 22
                )
                org.headquarters = rng.choice(self.city_ids)
            org.country = self.entities[org.headquarters].country
            self.org_ids.append(org.idx)

    def _assign_employers(self, rng: random.Random) -> None:
        orgs_by_year = sorted(self.org_ids, key=lambda i: self.entities[i].year)
        years = [self.entities[i].year for i in orgs_by_year]
        for idx in self.person_ids:
            person = self.entities[idx]
            if person.occupation in (N.DIRECTOR, N.ACTOR, "actress", N.ENTREPRENEUR) or rng.random() < 0.45:
                continue
            stop = bisect.bisect_right(years, person.birth[0] + 40)
            if stop:
                person.employer = orgs_by_year[rng.randrange(stop)]

    def _build_films(self, rng: random.Random) -> None:
        directors, actors = _ByYear(), _ByYear()
        for idx in self.person_ids:
            person = self.entities[idx]
            if person.occupation == N.DIRECTOR:
                directors.add(person.birth[0], idx)
            elif person.occupation in (N.ACTOR, "actress"):
                actors.add(person.birth[0], idx)
        studios = [i for i in self.org_ids if self.entities[i].org_kind == "film studio"] or self.org_ids
        used: set[str] = set()
        title_years: dict[str, set[int]] = defaultdict(set)
        self.film_ids: list[int] = []
        for _ in range(self.sizes.films):
            base = self.entities[rng.choice(self.film_ids)] if self.film_ids else None
            roll = rng.random()
            if base is not None and roll < self.near_duplicate_rate:  # a sequel
                suffix = rng.choice((" II", ": The Return", " Part Two", ": The Final Chapter"))
                film = self._new(FILM, N.unique(lambda r, t=base.name, s=suffix: t + s, rng, used))
                film.variant_of, film.variant = base.idx, "sequel"
                film.year = min(2023, base.year + rng.randint(2, 6))
                title_years[film.name].add(film.year)
                film.genre, film.director, film.company = base.genre, base.director, base.company
                film.lead = base.lead if rng.random() < 0.7 else actors.pick(rng, film.year - 65, film.year - 16)
            else:
                film = self._new(FILM, "")
                remake_year = rng.randint(base.year + 10, 2023) if base is not None and base.year < 2000 else None
                if (
                    remake_year is not None
                    and roll < self.near_duplicate_rate + self.same_name_rate
                    and remake_year not in title_years[base.name]  # a remake stays distinguishable by its year
                ):
                    film.name, film.variant_of, film.variant = base.name, base.idx, "remake"
                    film.year = remake_year
                else:
                    film.name = N.unique(N.make_film_title, rng, used)
                    film.year = rng.randint(1915, 2023)
                used.add(film.name)
                title_years[film.name].add(film.year)
                film.genre = rng.choice(N.GENRES)
                film.director = directors.pick(rng, film.year - 75, film.year - 22) or self.people_by_year.pick(
                    rng, film.year - 75, film.year - 22
                )
                film.lead = actors.pick(rng, film.year - 70, film.year - 16)
                candidates = [i for i in rng.sample(studios, min(8, len(studios))) if self.entities[i].year < film.year]
                film.company = candidates[0] if candidates else None
            director = self.entities[film.director] if film.director is not None else None
            film.country = (
                self.entities[film.company].country
                if film.company is not None
                else director.nationality
                if director
                else rng.randrange(len(self.countries))
            )
            self.film_ids.append(film.idx)

    def _shuffle(self, rng: random.Random) -> None:
        """Mix the kinds through the corpus: renumber entities in a random order."""
        order = list(range(len(self.entities)))
        rng.shuffle(order)
        new_index = {old: new for new, old in enumerate(order)}

        def remap(value: int | None) -> int | None:
            return None if value is None else new_index[value]

        entities = [self.entities[old] for old in order]
        for new, entity in enumerate(entities):
            entity.idx = new
            for name in (
                "variant_of",
                "birthplace",
                "father",
                "spouse",
                "employer",
                "director",
                "lead",
                "company",
                "founder",
                "headquarters",
            ):
                setattr(entity, name, remap(getattr(entity, name)))
        self.entities = entities
        for name in ("city_ids", "person_ids", "org_ids", "film_ids"):
            setattr(self, name, sorted(new_index[i] for i in getattr(self, name)))
        del self.people_by_year, self.men_by_year

    def _link(self) -> None:
        for film_id in self.film_ids:
            film = self.entities[film_id]
            if film.director is not None:
                self.entities[film.director].directed.append(film_id)
            if film.lead is not None:
                self.entities[film.lead].starred.append(film_id)
            if film.company is not None:
                self.entities[film.company].productions.append(film_id)
        for org_id in self.org_ids:
            org = self.entities[org_id]
            if org.founder is not None:
                self.entities[org.founder].founded.append(org_id)
            self.entities[org.headquarters].based_here.append(org_id)
        for person_id in self.person_ids:
            person = self.entities[person_id]
            self.entities[person.birthplace].natives.append(person_id)
            if person.father is not None:
                self.entities[person.father].children.append(person_id)
            if person.employer is not None:
                self.entities[person.employer].employees.append(person_id)

    def _disambiguate(self) -> None:
        """Qualifiers like Wikipedia's for shared names: the year for films, the occupation for people.

        Creation keeps (title, year) of remakes and (name, occupation, birth year) of namesakes
        unique, so the qualifiers make every title unique; a name shared across kinds gets the kind.
        """
        groups: dict[tuple[str, str], list[Entity]] = defaultdict(list)
        for entity in self.entities:
            groups[(entity.kind, entity.name)].append(entity)
        for (kind, _), members in groups.items():
            if len(members) == 1:
                continue
            for entity in members:
                if kind == FILM:
                    entity.qualifier = f"{entity.year} film"
                elif kind == PERSON:
                    clash = sum(m.occupation == entity.occupation for m in members) > 1
                    entity.qualifier = f"{entity.occupation}, born {entity.birth[0]}" if clash else entity.occupation
                else:
                    entity.qualifier = self.country_name(entity.country)
        by_title: dict[str, list[Entity]] = defaultdict(list)
        for entity in self.entities:
            by_title[entity.title].append(entity)
        for members in by_title.values():
            if len(members) > 1 and len({m.kind for m in members}) == len(members):  # same name, different kinds
                for entity in members:
                    kind = entity.occupation if entity.kind == PERSON else entity.org_kind or entity.kind
                    entity.qualifier = f"{entity.qualifier}, {kind}" if entity.qualifier else kind
        titles = Counter(e.title for e in self.entities)
        clashes = [title for title, n in titles.items() if n > 1]
        if clashes:
            raise RuntimeError(f"world generator bug: titles still shared after disambiguation: {clashes[:5]}")

    # -- queries --------------------------------------------------------------------------------

    def country_name(self, index: int | None) -> str:
        return self.countries[index][0] if index is not None else ""

    def demonym(self, index: int | None) -> str:
        return self.countries[index][1] if index is not None else ""

    def counts(self) -> dict[str, int]:
        return dict(Counter(e.kind for e in self.entities))

    def variant_counts(self) -> dict[str, int]:
        return dict(Counter(e.variant for e in self.entities if e.variant))
