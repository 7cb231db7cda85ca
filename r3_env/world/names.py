"""Vocabularies and name makers for the synthetic world.

Every proper name is invented (countries included), so the facts can be learned only from the
corpus: a pre-trained model has no parametric shortcut to them.
"""

from __future__ import annotations

import random

FIRST_NAMES_MALE = (
    "Aldo Anselm Arvid Bastian Benedek Bram Casimir Cedric Corin Dario Davor Eamon Edvin Elias Emeric Evander "
    "Falk Feliks Florin Gaspar Gideon Goran Hale Hector Ilario Isidor Ivo Jarek Jasper Joren Kasimir Kelvin "
    "Laszlo Lennart Leopold Lorcan Lucan Magnus Marek Matthias Milo Nestor Niklas Oren Orrin Osric Pavel "
    "Piran Quentin Radek Rafael Rainer Roan Rune Sandor Severin Silas Soren Stellan Tamas Teodor Tobias "
    "Torvald Ulric Valen Vidar Viggo Wendel Yannick Zoltan Anton Basil Conrad Darius Emil Gustav Henrik Ignatz"
).split()
FIRST_NAMES_FEMALE = (
    "Adela Agnes Alda Alina Amara Annika Aurelia Beata Brisa Calla Celestine Corina Dagny Delphine Edda Elin "
    "Elodie Esme Fenna Freya Gisela Greta Halina Hedda Ilka Imke Ines Isolde Jana Jovana Kaja Karina Leni "
    "Liesel Linnea Livia Lorena Maja Malin Marit Mira Nadia Nela Noemi Odile Orla Petra Priska Raina Rosalind "
    "Runa Sabine Selma Signe Solveig Tamsin Tekla Thea Ula Valeska Vesna Viola Wilma Xenia Yara Zora Zuzana "
    "Agathe Berit Clara Dorota Elke Fiora Helga Irena Judit Katya Lotte Mirela Nora"
).split()

_SURNAME_HEADS = (
    "Ash Bar Bel Bran Brek Cal Cor Dal Dorn Eld Fal Fen Gar Gel Hal Hart Hol Ingr Jar Kel Kern Lan Lor Mar "
    "Mer Nor Orm Pel Quar Rav Ros Sel Stav Tal Thorn Ul Val Vor Wen Wil Yar Zel"
).split()
_SURNAME_MIDS = ("", "", "", "a", "e", "i", "o", "en", "er", "in", "an", "ow", "is")
_SURNAME_TAILS = (
    "berg brook by croft dal dorf feld ford gaard holm hurst ik ing ley lund mark mont quist rick ski son stad "
    "strom ton vald vik wick worth zen"
).split()

_PLACE_HEADS = (
    "Ar Bal Bel Cor Dun Ed Fal Gal Hav Il Kar Kor Lar Lis Mal Mor Nar Ost Pal Ril Sar Sol Tar Tor Ul Val Ver "
    "Vir Wen Zar Brin Cald Dres Esk Grim Hest Jor Kess Lund Myr"
).split()
_PLACE_MIDS = ("", "a", "e", "i", "o", "en", "ar", "ol", "um", "es")
_PLACE_TAILS = (
    "bourg burgh dale fell gard grad haven holm ia ium kirk mere mouth ness port stad sted ton vale vik wick "
    "mar nor rin dor"
).split()

# (country, demonym): invented nations.
COUNTRIES = (
    ("Valdoria", "Valdorian"),
    ("Ostrevia", "Ostrevian"),
    ("Kelmark", "Kelmarkish"),
    ("Suvania", "Suvanian"),
    ("Brennland", "Brennish"),
    ("Carrosa", "Carrosan"),
    ("Dunmoor", "Dunmoorish"),
    ("Elyria", "Elyrian"),
    ("Faroval", "Farovalese"),
    ("Galicor", "Galicorian"),
    ("Halvenia", "Halvenian"),
    ("Istrova", "Istrovan"),
    ("Jorvania", "Jorvanian"),
    ("Korsland", "Korslander"),
    ("Lutheria", "Lutherian"),
    ("Marovia", "Marovian"),
    ("Nordavia", "Nordavian"),
    ("Orlesia", "Orlesian"),
    ("Pallandia", "Pallandian"),
    ("Quenmark", "Quenmarkish"),
    ("Rhovania", "Rhovanian"),
    ("Saldoria", "Saldorian"),
    ("Tavernia", "Tavernian"),
    ("Umbria Nova", "Novumbrian"),
    ("Vestalia", "Vestalian"),
    ("Wendmark", "Wendish"),
    ("Yssaria", "Yssarian"),
    ("Zembla", "Zemblan"),
    ("Aurovia", "Aurovian"),
    ("Belmora", "Belmoran"),
    ("Cyrenia", "Cyrenian"),
    ("Drossland", "Drosslander"),
    ("Estmere", "Estmerian"),
    ("Felmark", "Felmarkish"),
    ("Grenvald", "Grenvaldian"),
    ("Hollmark", "Hollmarkish"),
    ("Ilvania", "Ilvanian"),
    ("Kastoria", "Kastorian"),
    ("Lorvania", "Lorvanian"),
    ("Mistral", "Mistralian"),
)

OCCUPATIONS = (
    "painter",
    "novelist",
    "poet",
    "composer",
    "architect",
    "physicist",
    "chemist",
    "historian",
    "sculptor",
    "economist",
    "mathematician",
    "journalist",
    "diplomat",
    "politician",
    "engineer",
    "photographer",
    "cartographer",
    "botanist",
    "violinist",
    "philosopher",
    "surgeon",
    "astronomer",
    "lawyer",
    "playwright",
)
DIRECTOR, ACTOR, ENTREPRENEUR = "film director", "actor", "entrepreneur"

GENRES = (
    "drama",
    "comedy",
    "thriller",
    "western",
    "musical",
    "war",
    "science fiction",
    "romance",
    "crime",
    "horror",
    "adventure",
    "mystery",
    "documentary",
    "fantasy",
)

ORG_KINDS = (
    "company",
    "film studio",
    "university",
    "publishing house",
    "bank",
    "orchestra",
    "newspaper",
    "shipping company",
    "engineering firm",
    "record label",
    "museum",
    "airline",
)
_ORG_SUFFIX_BY_KIND = {
    "company": ("Industries", "Holdings", "Works", "Group", "Trading Company"),
    "film studio": ("Pictures", "Studios", "Film Company", "Motion Pictures"),
    "university": ("University", "Institute of Technology", "College"),
    "publishing house": ("Press", "Publishing", "Books"),
    "bank": ("Bank", "Savings Bank", "Credit Union"),
    "orchestra": ("Symphony Orchestra", "Philharmonic", "Chamber Orchestra"),
    "newspaper": ("Gazette", "Herald", "Courier", "Tribune"),
    "shipping company": ("Shipping Line", "Maritime", "Steamship Company"),
    "engineering firm": ("Engineering", "Ironworks", "Machine Works"),
    "record label": ("Records", "Music", "Sound"),
    "museum": ("Museum of Art", "Museum", "Gallery"),
    "airline": ("Airways", "Air", "Aviation"),
}
_ORG_HEADS = (
    "Northwind Silverline Ironbridge Bluewater Redstone Greyhaven Goldcrest Blackwood Whitecliff Highmoor "
    "Stonegate Brightwater Oakridge Eastmarch Westbrook Riverside Lakeshore Summit Meridian Harbor Evergreen "
    "Crescent Pioneer Beacon Granite Falcon Heron Lantern Compass Anchor Thistle Juniper Aurora Zenith "
    "Polaris Vanguard Cobalt Amber Sterling Marble Cedar Willow Aspen Saffron Obsidian Copper Kestrel"
).split()

FILM_ADJECTIVES = (
    "Silent Crimson Hollow Broken Distant Golden Frozen Burning Quiet Lonely Hidden Wandering Forgotten "
    "Restless Scarlet Pale Endless Bitter Gentle Secret Fading Iron Glass Velvet Midnight Northern Last "
    "Winter Summer Stolen Paper Copper Silver Shattered Sleeping Wild Narrow Open Sunken"
).split()
FILM_NOUNS = (
    "Harbor River Garden Mirror Lantern Orchard Bridge Tower Meadow Voyage Letter Shadow Promise Season "
    "Frontier Canyon Island Carnival Station Lighthouse Winter Parade Valley Kingdom Echo Horizon Compass "
    "Ballad Covenant Fortune Labyrinth Masquerade Monument Passage Requiem Sanctuary Tide Verdict Widow"
).split()
_FILM_PATTERNS = (
    "The {adj} {noun}",
    "{adj} {noun}",
    "The {noun} of {place}",
    "{noun} at {place}",
    "A {adj} {noun}",
    "Beyond the {adj} {noun}",
    "{place} {noun}",
    "The {noun}s of {place}",
)

PLOT_SUBJECTS = (
    "a retired sailor",
    "two estranged sisters",
    "a young clerk",
    "a travelling musician",
    "a disgraced officer",
    "a village schoolteacher",
    "an ambitious reporter",
    "a widowed baker",
    "a runaway heir",
    "a stubborn lighthouse keeper",
    "a group of miners",
    "an aging boxer",
)
PLOT_ACTIONS = (
    "searches for a lost brother",
    "returns home after twenty years",
    "uncovers a forgery ring",
    "falls in love during a long winter",
    "tries to save a failing theatre",
    "is drawn into a border conflict",
    "plans a daring escape",
    "solves a string of thefts",
    "competes in a national contest",
    "builds a bridge against all odds",
)

FILLER_PERSON = (
    "{Pron} was known among colleagues for an exacting, methodical style.",
    "Later critics described {poss} early work as uneven but ambitious.",
    "{Pron} travelled widely and kept detailed journals of {poss} journeys.",
    "Several of {poss} letters survive in private collections.",
    "{Pron} gave occasional public lectures on {topic}.",
    "A biography of {obj} appeared after {poss} retirement.",
    "{Pron} spent several years abroad before settling down.",
    "Contemporaries remembered {obj} as reserved and hard-working.",
)
FILLER_TOPICS = (
    "design",
    "music",
    "history",
    "navigation",
    "education",
    "public health",
    "the arts",
    "local politics",
    "architecture",
    "literature",
    "science",
    "trade",
)
FILLER_CITY = (
    "The old town is known for its narrow streets and covered markets.",
    "A river crossing has stood at the site since early times.",
    "The economy historically relied on {trade}.",
    "Its annual autumn fair draws visitors from across the region.",
    "The city was largely rebuilt after a great fire.",
)
TRADES = ("wool and textiles", "fishing", "timber", "salt mining", "shipbuilding", "glassmaking", "wine", "printing")
FILLER_ORG = (
    "It expanded steadily during its first decades.",
    "The organisation went through several reorganisations.",
    "Its archives are kept at its main offices.",
    "It employs several hundred people.",
    "It was briefly renamed before returning to its original name.",
)
FILLER_FILM = (
    "The film was shot over a single summer.",
    "Critics were divided on its pacing but praised the score.",
    "It was restored and re-released decades later.",
    "The production ran well over its original budget.",
    "It was one of the most discussed releases of its year.",
)

MONTHS = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)


def make_surname(rng: random.Random) -> str:
    return rng.choice(_SURNAME_HEADS) + rng.choice(_SURNAME_MIDS) + rng.choice(_SURNAME_TAILS)


def make_place(rng: random.Random) -> str:
    return rng.choice(_PLACE_HEADS) + rng.choice(_PLACE_MIDS) + rng.choice(_PLACE_TAILS)


_CITY_PREFIXES = ("", "", "", "", "", "Upper ", "Lower ", "New ", "Old ", "Port ", "Saint ", "East ", "West ")
_CITY_SUFFIXES = ("", "", "", "", "", " Falls", " Springs", " Heights", " Bay", " Crossing", " Hill")


def make_city_name(rng: random.Random) -> str:
    return rng.choice(_CITY_PREFIXES) + make_place(rng) + rng.choice(_CITY_SUFFIXES)


TWIN_PREFIXES = ("North", "South", "Upper", "Lower", "New")


def city_core(name: str) -> str:
    """A city name without its prefix and suffix words ('Port Varholm Falls' -> 'Varholm')."""
    for prefix in (*_CITY_PREFIXES, *(p + " " for p in TWIN_PREFIXES)):
        if prefix and name.startswith(prefix):
            name = name[len(prefix) :]
    for suffix in _CITY_SUFFIXES:
        if suffix and name.endswith(suffix):
            name = name[: -len(suffix)]
    return name


def make_org_name(rng: random.Random, kind: str) -> str:
    head = rng.choice(_ORG_HEADS) if rng.random() < 0.6 else make_place(rng)
    return f"{head} {rng.choice(_ORG_SUFFIX_BY_KIND[kind])}"


def make_film_title(rng: random.Random) -> str:
    pattern = rng.choice(_FILM_PATTERNS)
    return pattern.format(adj=rng.choice(FILM_ADJECTIVES), noun=rng.choice(FILM_NOUNS), place=make_place(rng))


def unique(make, rng: random.Random, used: set[str], attempts: int = 50) -> str:
    """A fresh name from ``make(rng)``; after ``attempts`` collisions a roman numeral disambiguates."""
    for _ in range(attempts):
        name = make(rng)
        if name not in used:
            used.add(name)
            return name
    base = make(rng)
    for numeral in ("II", "III", "IV", "V", "VI", "VII", "VIII", "IX", "X"):
        name = f"{base} {numeral}"
        if name not in used:
            used.add(name)
            return name
    name = f"{base} {len(used)}"
    used.add(name)
    return name
