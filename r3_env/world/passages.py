"""One passage per entity, stating its facts in varied natural sentences.

Each passage draws its wording from its own random stream (seeded by the world seed and the
entity), so a passage does not depend on the order in which passages are written. Besides its
own facts, a passage names some entities that point to it (the films a director made, the
companies a person founded, the people born in a city), as encyclopaedia articles do.
"""

from __future__ import annotations

import random

from r3_env.data import Passage
from r3_env.world import names as N
from r3_env.world.graph import CITY, FILM, ORG, PERSON, Entity, World


def format_date(date: tuple[int, int, int], style: int) -> str:
    year, month, day = date
    return f"{N.MONTHS[month - 1]} {day}, {year}" if style else f"{day} {N.MONTHS[month - 1]} {year}"


def date_answers(date: tuple[int, int, int]) -> list[str]:
    """Every way a passage may write the date, plus ISO."""
    year, month, day = date
    return [format_date(date, 0), format_date(date, 1), f"{year:04d}-{month:02d}-{day:02d}"]


def _join(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _article(word: str) -> str:
    return "an" if word[0].lower() in "aeiou" else "a"


class PassageWriter:
    def __init__(self, world: World) -> None:
        self.world = world

    def passage(self, entity: Entity) -> Passage:
        rng = random.Random(f"passage:{self.world.seed}:{entity.idx}")
        render = {PERSON: self._person, FILM: self._film, CITY: self._city, ORG: self._organisation}[entity.kind]
        first, rest = render(entity, rng)
        rng.shuffle(rest)
        text = " ".join([first, *rest])
        return Passage.from_title_text(str(entity.idx), entity.title, text)

    def _name(self, idx: int | None) -> str:
        return self.world.entities[idx].name if idx is not None else ""

    def _person(self, p: Entity, rng: random.Random) -> tuple[str, list[str]]:
        w = self.world
        he, his, him = ("he", "his", "him") if p.gender == "m" else ("she", "her", "her")
        He = he.capitalize()
        style = rng.randrange(2)
        born, died = format_date(p.birth, style), format_date(p.death, style) if p.death else None
        city, nat = self._name(p.birthplace), w.demonym(p.nationality)
        role = f"{nat} {p.occupation}"
        opening = rng.randrange(3)
        if opening == 0:
            first = (
                f"{p.name} ({born} – {died}) was {_article(nat)} {role}."
                if died
                else f"{p.name} (born {born}) is {_article(nat)} {role}."
            )
        elif opening == 1:
            first = f"{p.name} was {_article(nat)} {role}, born on {born} in {city}."
        else:
            verb = "was" if died else "is"
            first = f"Born in {city} on {born}, {p.name} {verb} {_article(nat)} {role}."
        rest: list[str] = []
        if opening == 0:
            rest.append(
                rng.choice(
                    (
                        f"{He} was born in {city}.",
                        f"{He} was born in {city}, {w.country_name(w.entities[p.birthplace].country)}.",
                        f"{his.capitalize()} birthplace was {city}.",
                    )
                )
            )
        if died and opening != 0:
            rest.append(rng.choice((f"{He} died on {died}.", f"{He} passed away on {died}.")))
        if p.father is not None:
            child = "son" if p.gender == "m" else "daughter"
            rest.append(
                rng.choice(
                    (
                        f"{He} was the {child} of {self._name(p.father)}.",
                        f"{his.capitalize()} father was {self._name(p.father)}.",
                        f"{He} was born to {self._name(p.father)}.",
                    )
                )
            )
        if p.spouse is not None:
            partner = "husband" if p.gender == "f" else "wife"
            rest.append(
                rng.choice(
                    (
                        f"{He} married {self._name(p.spouse)}.",
                        f"{He} was married to {self._name(p.spouse)}.",
                        f"{his.capitalize()} {partner} was {self._name(p.spouse)}.",
                    )
                )
            )
        if p.employer is not None:
            rest.append(
                rng.choice(
                    (
                        f"{He} worked for {self._name(p.employer)}.",
                        f"{He} spent much of {his} career at {self._name(p.employer)}.",
                        f"{He} was employed by {self._name(p.employer)}.",
                    )
                )
            )
        children = [self._name(c) for c in p.children[:4]]
        if children:
            rest.append(
                rng.choice(
                    (
                        f"{his.capitalize()} children include {_join(children)}.",
                        f"{He} was the father of {_join(children)}.",
                    )
                )
            )
        films = [
            f"{w.entities[f].name} ({w.entities[f].year})"
            for f in sorted(p.directed, key=lambda f: w.entities[f].year)[:6]
        ]
        if films:
            rest.append(
                rng.choice(
                    (f"{He} directed {_join(films)}.", f"{his.capitalize()} films as director include {_join(films)}.")
                )
            )
        roles = [w.entities[f].name for f in sorted(p.starred, key=lambda f: w.entities[f].year)[:4]]
        if roles:
            rest.append(
                rng.choice(
                    (f"{He} appeared in {_join(roles)}.", f"{his.capitalize()} screen roles include {_join(roles)}.")
                )
            )
        for org in p.founded[:3]:
            o = w.entities[org]
            rest.append(rng.choice((f"{He} founded {o.name} in {o.year}.", f"In {o.year}, {he} established {o.name}.")))
        for template in rng.sample(N.FILLER_PERSON, rng.randint(0, 2)):
            rest.append(template.format(Pron=He, poss=his, obj=him, topic=rng.choice(N.FILLER_TOPICS)))
        return first, rest

    def _film(self, f: Entity, rng: random.Random) -> tuple[str, list[str]]:
        w = self.world
        nat = w.demonym(f.country)
        director = self._name(f.director)
        opening = rng.randrange(3) if director else 3
        if opening == 0:
            first = f"{f.name} is {_article(str(f.year))} {f.year} {nat} {f.genre} film directed by {director}."
        elif opening == 1:
            first = f"{f.name} is {_article(nat)} {nat} {f.genre} film from {f.year}, directed by {director}."
        elif opening == 2:
            first = f"Directed by {director}, {f.name} is {_article(nat)} {nat} {f.genre} film released in {f.year}."
        else:
            first = f"{f.name} is {_article(nat)} {nat} {f.genre} film released in {f.year}."
        rest: list[str] = []
        if f.lead is not None:
            rest.append(
                rng.choice(
                    (
                        f"It stars {self._name(f.lead)} in the leading role.",
                        f"{self._name(f.lead)} plays the lead.",
                        f"The lead role is played by {self._name(f.lead)}.",
                    )
                )
            )
        if f.company is not None:
            rest.append(
                rng.choice(
                    (f"It was produced by {self._name(f.company)}.", f"The film was made by {self._name(f.company)}.")
                )
            )
        if f.variant == "sequel":
            rest.append(f"It is a sequel to {self._name(f.variant_of)}.")
        elif f.variant == "remake":
            rest.append(f"It is a remake of the {w.entities[f.variant_of].year} film of the same name.")
        rest.append(f"The story follows {rng.choice(N.PLOT_SUBJECTS)} who {rng.choice(N.PLOT_ACTIONS)}.")
        rest.extend(rng.sample(N.FILLER_FILM, rng.randint(0, 2)))
        return first, rest

    def _city(self, c: Entity, rng: random.Random) -> tuple[str, list[str]]:
        w = self.world
        country = w.country_name(c.country)
        first = rng.choice(
            (
                f"{c.name} is a city in {country}.",
                f"{c.name} is a town in {country}.",
                f"Located in {country}, {c.name} is a regional centre.",
            )
        )
        rest = [
            rng.choice(
                (
                    f"It was founded in {c.year}.",
                    f"The settlement dates from {c.year}.",
                    f"It was established in {c.year}.",
                )
            ),
            f"It has a population of about {c.population:,}.",
        ]
        if c.variant == "twin town":
            rest.append(f"It lies close to {self._name(c.variant_of)}.")
        natives = [self._name(p) for p in c.natives[:4]]
        if natives:
            rest.append(f"Notable people born in {c.name} include {_join(natives)}.")
        based = [self._name(o) for o in c.based_here[:2]]
        if based:
            rest.append(
                rng.choice((f"It is home to {_join(based)}.", f"Organisations based here include {_join(based)}."))
            )
        rest.extend(t.format(trade=rng.choice(N.TRADES)) for t in rng.sample(N.FILLER_CITY, rng.randint(0, 2)))
        return first, rest

    def _organisation(self, o: Entity, rng: random.Random) -> tuple[str, list[str]]:
        w = self.world
        nat = w.demonym(o.country)
        founder = self._name(o.founder)
        rest: list[str] = []
        if founder and rng.random() < 0.5:
            first = f"{o.name} is {_article(nat)} {nat} {o.org_kind} founded in {o.year} by {founder}."
        else:
            first = f"{o.name} is {_article(nat)} {nat} {o.org_kind} established in {o.year}."
            if founder:
                rest.append(rng.choice((f"It was founded by {founder}.", f"Its founder was {founder}.")))
        city = self._name(o.headquarters)
        rest.append(
            rng.choice(
                (
                    f"It is headquartered in {city}.",
                    f"Its headquarters are in {city}, {w.country_name(o.country)}.",
                    f"The organisation is based in {city}.",
                )
            )
        )
        if o.variant == "subsidiary":
            rest.append(f"It is a subsidiary of {self._name(o.variant_of)}.")
        films = [w.entities[f].name for f in o.productions[:4]]
        if films:
            rest.append(f"Its productions include {_join(films)}.")
        staff = [self._name(p) for p in o.employees[:2]]
        if staff:
            rest.append(f"Notable employees have included {_join(staff)}.")
        rest.extend(rng.sample(N.FILLER_ORG, rng.randint(0, 2)))
        return first, rest
