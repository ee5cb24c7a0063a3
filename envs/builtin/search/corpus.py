"""The `search` corpus: a synthetic encyclopedia generated from a seed, nothing downloaded.

A world of invented countries, cities, rivers, universities, companies and people whose facts
link them (a person's birthplace is a city, a city lies in a country, a company has a founder
and a headquarters...). Names are made of invented syllables, so no model knows a fact from
pretraining: every answer has to be read from the pages. Names deliberately share parts
(surnames, city roots reused in company and university names) so a search returns confusable
pages, the distractors a multi-hop question has to get past.

Every page is an infobox (`Key: value` lines) and a few sentences of prose saying the same
facts, plus back-links (people born in a city, companies based there) that make a city's name
match many pages. The same (seed, sizes) always give the same pages, byte for byte
(`corpus_digest`); the manifest pins the digest of the shipped corpus.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections import defaultdict
from dataclasses import dataclass, field

# How many entities of each kind; ~2,600 pages in all.
SIZES = {"country": 30, "city": 300, "river": 90, "university": 120, "company": 420,
         "person": 1640}

# Relations: (kind, fact) -> the kind of the entity the fact names.
RELATIONS: dict[tuple[str, str], str] = {
    ("person", "birthplace"): "city", ("person", "alma_mater"): "university",
    ("city", "country"): "country", ("city", "mayor"): "person", ("city", "river"): "river",
    ("country", "capital"): "city", ("company", "founder"): "person",
    ("company", "headquarters"): "city", ("company", "ceo"): "person",
    ("university", "city"): "city", ("river", "source_country"): "country",
}
# Attributes: (kind, fact) whose values are plain strings or numbers.
ATTRIBUTES = [("person", "born"), ("person", "occupation"), ("city", "population"),
              ("city", "founded"), ("country", "currency"), ("country", "independence"),
              ("river", "length_km"), ("university", "founded"), ("university", "students"),
              ("company", "founded"), ("company", "industry")]
# The infobox key each fact is printed under.
LABELS = {"birthplace": "Birthplace", "alma_mater": "Alma mater", "country": "Country",
          "mayor": "Mayor", "river": "River", "capital": "Capital", "founder": "Founder",
          "headquarters": "Headquarters", "ceo": "Chief executive", "city": "City",
          "source_country": "Source country", "born": "Born", "occupation": "Occupation",
          "population": "Population", "founded": "Founded", "currency": "Currency",
          "independence": "Independence", "length_km": "Length (km)", "students": "Students",
          "industry": "Industry"}

ONSETS = ["b", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br",
          "dr", "kr", "st", "th", "tr", "sh", "gl", "fr"]
VOWELS = ["a", "e", "i", "o", "u", "a", "e", "o", "ae", "ia", "ou", "y"]
CODAS = ["", "", "n", "r", "l", "s", "th", "m", "x", "nd", "rk"]
OCCUPATIONS = ["architect", "astronomer", "botanist", "cartographer", "chemist", "composer",
               "economist", "engineer", "geologist", "historian", "jurist", "linguist",
               "mathematician", "novelist", "painter", "physician", "poet", "sculptor",
               "surveyor", "violinist"]
INDUSTRIES = ["aviation", "banking", "brewing", "ceramics", "chemicals", "publishing",
              "insurance", "mining", "optics", "railways", "shipbuilding", "software",
              "steel", "textiles", "timber"]
CURRENCIES = ["crown", "mark", "florin", "dinar", "thaler", "ducat", "real", "sol"]
COMPANY_SUFFIXES = ["Industries", "Holdings", "Works", "Group", "Laboratories", "Shipping",
                    "Mills", "Trading Company"]
COUNTRY_SUFFIXES = ["ia", "land", "ar", "ovia", "estan", "enne"]


@dataclass
class Entity:
    name: str
    kind: str
    facts: dict[str, str | int] = field(default_factory=dict)  # relations hold names


@dataclass(frozen=True)
class Page:
    title: str
    kind: str
    text: str


class _Names:
    """Invented words (roots, given names, surnames) and entity names, each used once."""

    def __init__(self, r: random.Random) -> None:
        self.r = r
        self.words: set[str] = set()
        self.names: set[str] = set()

    def word(self, syllables: int | None = None) -> str:
        while True:
            n = syllables or self.r.choice([2, 2, 3])
            w = "".join(self.r.choice(ONSETS) + self.r.choice(VOWELS) for _ in range(n))
            w = (w + self.r.choice(CODAS)).capitalize()
            if w not in self.words and 4 <= len(w) <= 10:
                self.words.add(w)
                return w

    def unique(self, options: list[str]) -> str | None:
        """One of `options` (drawn with their multiplicity) naming nothing yet; None if all
        do (the caller draws other options)."""
        free = [o for o in options if o not in self.names]
        if not free:
            return None
        name = self.r.choice(free)
        self.names.add(name)
        return name


def generate_world(seed: int, sizes: dict[str, int] | None = None) -> dict[str, Entity]:
    """Every entity by name; the same seed and sizes give the same world."""
    sizes = sizes or SIZES
    r = random.Random(seed)
    names = _Names(r)
    kinds: dict[str, list[Entity]] = defaultdict(list)

    def add(kind: str, name: str, **facts: str | int) -> Entity:
        e = Entity(name, kind, dict(facts))
        kinds[kind].append(e)
        return e

    for _ in range(sizes["country"]):
        name = None
        while name is None:
            name = names.unique([names.word(2) + r.choice(COUNTRY_SUFFIXES)])
        add("country", name, currency=f"{names.word(2)} {r.choice(CURRENCIES)}",
            independence=r.randint(1500, 1990))
    for _ in range(sizes["river"]):
        name = None
        while name is None:
            name = names.unique([f"{names.word()} River"])
        add("river", name, length_km=r.randint(80, 4200),
            source_country=r.choice(kinds["country"]).name)
    city_roots = []
    for i in range(sizes["city"]):
        name = None
        while name is None:
            root = names.word()
            name = names.unique([root, root, root, f"Port {root}", f"{root} Heights",
                                 f"New {root}"])
        city_roots.append(root)
        # the first cities go one to each country, so every country has a capital of its own
        country = kinds["country"][i] if i < len(kinds["country"]) \
            else r.choice(kinds["country"])
        add("city", name, country=country.name,
            population=r.randint(8000, 4_800_000), founded=r.randint(700, 1900),
            river=r.choice(kinds["river"]).name)
    for country in kinds["country"]:
        own = [c for c in kinds["city"] if c.facts["country"] == country.name]
        country.facts["capital"] = max(own, key=lambda c: int(c.facts["population"])).name
    for _ in range(sizes["university"]):
        name = None
        while name is None:  # a city's root half the time: a distractor for the city
            root = r.choice([names.word(), r.choice(city_roots)])
            name = names.unique([f"University of {root}", f"{root} Institute",
                                 f"{root} College"])
        add("university", name, city=r.choice(kinds["city"]).name,
            founded=r.randint(1100, 1990), students=r.randint(400, 60000))
    surnames = [names.word() for _ in range(sizes["person"] // 3)]
    given = [names.word(2) for _ in range(160)]
    for _ in range(sizes["person"]):
        name = None
        while name is None:  # surnames shared by about three people each
            name = names.unique([f"{r.choice(given)} {r.choice(surnames)}"])
        add("person", name, born=r.randint(1840, 1995), occupation=r.choice(OCCUPATIONS),
            birthplace=r.choice(kinds["city"]).name,
            alma_mater=r.choice(kinds["university"]).name)
    people = kinds["person"]
    for city in kinds["city"]:
        city.facts["mayor"] = r.choice(people).name
    founders = [p for p in people if int(p.facts["born"]) <= 1975]  # founded by 2020
    for _ in range(sizes["company"]):
        founder = r.choice(founders)
        name = None
        while name is None:  # a new word, the founder's surname or a city's root
            root = r.choice([names.word(), founder.name.split()[1], r.choice(city_roots)])
            name = names.unique([f"{root} {suffix}" for suffix in COMPANY_SUFFIXES])
        add("company", name, founder=founder.name, headquarters=r.choice(kinds["city"]).name,
            ceo=r.choice(people).name, industry=r.choice(INDUSTRIES),
            founded=int(founder.facts["born"]) + r.randint(22, 45))
    return {e.name: e for kind in SIZES for e in kinds[kind]}


def _prose(e: Entity) -> str:
    f = e.facts
    if e.kind == "person":
        return (f"{e.name} (born {f['born']}) is {_a(f['occupation'])} from {f['birthplace']}. "
                f"{e.name.split()[0]} studied at {f['alma_mater']}.")
    if e.kind == "city":
        return (f"{e.name} is a city in {f['country']} on the {f['river']}, founded in "
                f"{f['founded']}, with a population of {f['population']}. Its mayor is "
                f"{f['mayor']}.")
    if e.kind == "country":
        return (f"{e.name} became independent in {f['independence']}. Its capital is "
                f"{f['capital']} and its currency is the {f['currency']}.")
    if e.kind == "river":
        return (f"The {e.name} rises in {f['source_country']} and is {f['length_km']} km "
                "long.")
    if e.kind == "university":
        return (f"{e.name} was founded in {f['founded']} in {f['city']} and has "
                f"{f['students']} students.")
    return (f"{e.name} is {_a(f['industry'])} company founded in {f['founded']} by "
            f"{f['founder']}, with its headquarters in {f['headquarters']}. Its chief "
            f"executive is {f['ceo']}.")


def _a(word: object) -> str:
    return f"{'an' if str(word)[0] in 'aeiou' else 'a'} {word}"


def _backlinks(world: dict[str, Entity]) -> dict[str, list[str]]:
    """Sentences naming an entity on other pages (capped, so no page grows without bound)."""
    born, based, flows = defaultdict(list), defaultdict(list), defaultdict(list)
    for e in world.values():
        if e.kind == "person":
            born[e.facts["birthplace"]].append(e.name)
        elif e.kind == "company":
            based[e.facts["headquarters"]].append(e.name)
        elif e.kind == "city":
            flows[e.facts["river"]].append(e.name)
    lines: dict[str, list[str]] = defaultdict(list)
    for name, group, what in [(n, g, "People born here include") for n, g in born.items()] + \
            [(n, g, "Companies based here include") for n, g in based.items()] + \
            [(n, g, "Cities on the river include") for n, g in flows.items()]:
        lines[str(name)].append(f"{what} {', '.join(sorted(map(str, group))[:6])}.")
    return lines


def render_pages(world: dict[str, Entity]) -> list[Page]:
    """One page per entity, in a fixed order (kind, then name)."""
    back = _backlinks(world)
    pages = []
    for e in sorted(world.values(), key=lambda e: (e.kind, e.name)):
        box = [f"Kind: {e.kind}"] + [f"{LABELS[k]}: {v}" for k, v in e.facts.items()]
        text = "\n".join([e.name, *box, "", _prose(e), *back.get(e.name, [])])
        pages.append(Page(e.name, e.kind, text))
    return pages


def infobox(text: str) -> dict[str, str]:
    """A page's `Key: value` lines (up to the first blank line) as a dict."""
    head = text.split("\n\n", 1)[0].splitlines()[1:]
    return {k: v.strip() for k, _, v in (line.partition(":") for line in head)}


def corpus_digest(pages: list[Page]) -> str:
    """sha256 of the pages as canonical JSON lines: what `[metadata] corpus_sha256` pins."""
    h = hashlib.sha256()
    for p in pages:
        h.update(json.dumps([p.title, p.kind, p.text], ensure_ascii=False).encode() + b"\n")
    return h.hexdigest()
