"""Multi-hop question synthesis over the corpus, with a validator and the oracle that follows
the recorded hops.

A question is a chain: a named start entity, 1-4 relations (founder, birthplace, capital...)
and a final fact, read as nested noun phrases ("In what year was the founder of the company
headquartered in ... born?"). Its `hops` are the pages to open in order and the infobox key to
read on each; `hops` counts pages, 2-4, and sets the difficulty (easy, medium, hard). Every
relation is a function (one founder, one birthplace), so each chain has exactly one answer.

The validator keeps a question only when
* search is needed: the answer does not appear in the question (no distinctive word of it,
  for names), and the no-search prior (`guess_without_search`: the most common answer of the
  question's form, from the question's words alone) does not give it;
* search suffices: the oracle, following the hops through the environment's real `search` and
  `open_page` calls, reads exactly the recorded answer;
* it is new: no earlier question has the same text.
"""

from __future__ import annotations

import json
import random
import re
import unicodedata
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from envhub.envs.builtin.search.corpus import ATTRIBUTES, LABELS, RELATIONS, Entity, infobox
from envhub.envs.builtin.search.tools import hit_titles
from envhub.envs.tools.result import ToolResult

# The noun phrase a relation makes of the phrase `x` naming its subject.
RELATION_PHRASES = {
    ("person", "birthplace"): "the city where {x} was born",
    ("person", "alma_mater"): "the university that {x} attended",
    ("city", "country"): "the country in which {x} lies",
    ("city", "mayor"): "the mayor of {x}",
    ("city", "river"): "the river that flows through {x}",
    ("country", "capital"): "the capital of {x}",
    ("company", "founder"): "the founder of {x}",
    ("company", "headquarters"): "the city where {x} has its headquarters",
    ("company", "ceo"): "the chief executive of {x}",
    ("university", "city"): "the city where {x} is located",
    ("river", "source_country"): "the country where {x} rises",
}
# The question a final attribute asks about the phrase `x`.
ATTRIBUTE_QUESTIONS = {
    ("person", "born"): "In what year was {x} born?",
    ("person", "occupation"): "What is the occupation of {x}?",
    ("city", "population"): "What is the population of {x}?",
    ("city", "founded"): "In what year was {x} founded?",
    ("country", "currency"): "What is the currency of {x}?",
    ("country", "independence"): "In what year did {x} become independent?",
    ("river", "length_km"): "How long, in kilometres, is {x}?",
    ("university", "founded"): "In what year was {x} founded?",
    ("university", "students"): "How many students does {x} have?",
    ("company", "founded"): "In what year was {x} founded?",
    ("company", "industry"): "In which industry does {x} work?",
}
NAME_QUESTION = "What is the name of {x}?"
DIFFICULTY = {2: "easy", 3: "medium", 4: "hard"}
ATTRIBUTE_SHARE = 0.75  # of questions ending on an attribute; the rest ask for a name
# Words too common in names to give an answer away (and articles the normaliser drops).
COMMON_WORDS = {"the", "of", "a", "an", "port", "new", "heights", "river", "university",
                "institute", "college", "industries", "holdings", "works", "group",
                "laboratories", "shipping", "mills", "trading", "company"}
UNITS = {"km", "kilometres", "kilometers", "students", "people", "inhabitants"}
SEARCH_DEPTH = 5  # the oracle looks for the next page among this many results

Call = Callable[[str, str], ToolResult]  # (tool name, JSON arguments) -> result


def normalise(text: str) -> str:
    """An answer as compared: case, punctuation, thousands separators, a leading article, a
    trailing unit word and spacing do not matter; a decimal point does ("1848.0" is not 1848)."""
    text = unicodedata.normalize("NFKC", text).casefold()
    text = re.sub(r"(?<=\d),(?=\d{3}\b)", "", text)
    words = re.sub(r"(?!(?<=\d)[.,](?=\d))[^\w\s]", "", text).split()
    if words and words[0] in ("the", "a", "an"):
        words = words[1:]
    if len(words) > 1 and words[-1] in UNITS:
        words = words[:-1]
    return " ".join(words)


@dataclass
class Question:
    id: str
    question: str
    answer: str
    hops: list[dict[str, str]]  # [{"page": title, "key": infobox key to read}], in order
    difficulty: str
    form: str  # the question's template: what the no-search prior keys on
    distractors: list[str] = field(default_factory=list)  # confusable pages search returned

    def row(self) -> dict[str, object]:
        return asdict(self)


def _form_of(question: str) -> str | None:
    """The template a question was made from, recognised from its words alone."""
    for template in [*ATTRIBUTE_QUESTIONS.values(), NAME_QUESTION]:
        head, tail = template.split("{x}")
        if question.startswith(head) and question.endswith(tail):
            inner = question[len(head):len(question) - len(tail)]
            if template != NAME_QUESTION:
                return template
            for phrase in RELATION_PHRASES.values():  # a name question: its outer relation
                before, after = phrase.split("{x}")
                if inner.startswith(before) and inner.endswith(after):
                    return f"{template}|{phrase}"
    return None


def priors(world: dict[str, Entity]) -> dict[str, str]:
    """The most common answer of each question form over the whole corpus: what an agent that
    knows the world's statistics but searches nothing would guess."""
    counts: dict[str, Counter[str]] = {}
    for (kind, key), template in ATTRIBUTE_QUESTIONS.items():
        for e in world.values():
            if e.kind == kind:
                counts.setdefault(template, Counter())[normalise(str(e.facts[key]))] += 1
    for (kind, key), phrase in RELATION_PHRASES.items():
        for e in world.values():
            if e.kind == kind:
                counts.setdefault(f"{NAME_QUESTION}|{phrase}", Counter())[
                    normalise(str(e.facts[key]))] += 1
    return {form: c.most_common(1)[0][0] for form, c in sorted(counts.items())}


def guess_without_search(question: str, prior: dict[str, str]) -> str:
    """The no-search baseline's answer: the prior of the question's form."""
    form = _form_of(question)
    return prior.get(form, "") if form else ""


def follow_hops(hops: list[dict[str, str]], call: Call) -> str | None:
    """The oracle: for each hop, search for the page's name, open it from the results and read
    the hop's key; the value read names the next hop's page. None where a step fails or leads
    anywhere but the recorded page."""
    name = hops[0]["page"]
    for i, hop in enumerate(hops):
        if i and name != hop["page"]:
            return None
        listing = call("search", json.dumps({"query": name, "k": SEARCH_DEPTH}))
        if listing.is_error or name not in hit_titles(listing.content):
            return None
        page = call("open_page", json.dumps({"title": name}))
        value = None if page.is_error else infobox(page.content).get(hop["key"])
        if value is None:
            return None
        name = value
    return name


def _chain(r: random.Random, world: dict[str, Entity], by_kind: dict[str, list[Entity]],
           pages: int) -> tuple[list[Entity], list[str], str | None] | None:
    """A random walk: the entities visited, the relations taken, the final attribute (None for
    a name question); `pages` is how many pages solving it opens."""
    attribute = r.random() < ATTRIBUTE_SHARE
    steps = pages - 1 if attribute else pages
    entity = r.choice(by_kind[r.choice(sorted(by_kind))])
    visited, relations = [entity], []
    for _ in range(steps):
        options = [key for (kind, key) in RELATIONS if kind == entity.kind
                   and world[str(entity.facts[key])] not in visited]
        if not options:
            return None
        key = r.choice(options)
        entity = world[str(entity.facts[key])]
        visited.append(entity)
        relations.append(key)
    final = r.choice([k for kind, k in ATTRIBUTES if kind == entity.kind]) if attribute else None
    return visited, relations, final


def compose(visited: list[Entity], relations: list[str], final: str | None) -> Question:
    """The question text, answer and hops of a chain (id and distractors left empty)."""
    x = visited[0].name
    for entity, key in zip(visited, relations, strict=False):
        x = RELATION_PHRASES[(entity.kind, key)].format(x=x)
    last = visited[-1]
    if final is None:
        template, answer = NAME_QUESTION, last.name
        hops = [{"page": e.name, "key": LABELS[k]} for e, k in zip(visited, relations,
                                                                    strict=False)]
    else:
        template, answer = ATTRIBUTE_QUESTIONS[(last.kind, final)], str(last.facts[final])
        hops = [{"page": e.name, "key": LABELS[k]} for e, k in zip(visited, [*relations, final],
                                                                    strict=True)]
    text = template.format(x=x)
    return Question("", text[0].upper() + text[1:], answer, hops, DIFFICULTY[len(hops)],
                    _form_of(text) or template)


def rejection(q: Question, prior: dict[str, str], call: Call) -> str | None:
    """Why the validator rejects `q` (None: keep it)."""
    answer, asked = normalise(q.answer), f" {normalise(q.question)} "
    distinctive = [w for w in answer.split() if w not in COMMON_WORDS]
    if f" {answer} " in asked or any(f" {w} " in asked for w in distinctive):
        return "answer_in_question"
    if guess_without_search(q.question, prior) == answer:
        return "prior_guesses_it"
    found = follow_hops(q.hops, call)
    if found is None or normalise(found) != answer:
        return "oracle_failed"
    return None


def distractors(q: Question, call: Call) -> list[str]:
    """Pages the hops' searches return besides the right one: what a solver must not open."""
    out: list[str] = []
    on_path = {hop["page"] for hop in q.hops}
    for hop in q.hops:
        listing = call("search", json.dumps({"query": hop["page"], "k": SEARCH_DEPTH}))
        out += [t for t in hit_titles(listing.content) if t not in on_path and t not in out]
    return out[:12]


def synthesize(world: dict[str, Entity], call: Call, seed: int, count: int,
               difficulties: list[str] | None = None, max_attempts: int | None = None
               ) -> tuple[list[Question], Counter[str]]:
    """`count` validated questions (ids `search-<seed>-<index>`) and the rejections by reason.
    The same world, seed and count give the same questions."""
    pages_by_level = {v: k for k, v in DIFFICULTY.items()}
    levels = difficulties or list(DIFFICULTY.values())
    unknown = [d for d in levels if d not in pages_by_level]
    if unknown or not levels:
        raise ValueError(f"unknown difficulty {unknown}; choose from {list(pages_by_level)}")
    r, prior = random.Random(seed), priors(world)
    by_kind: dict[str, list[Entity]] = {}
    for e in world.values():
        by_kind.setdefault(e.kind, []).append(e)
    kept: list[Question] = []
    seen: set[str] = set()
    rejected: Counter[str] = Counter()
    for _ in range(max_attempts or count * 20):
        if len(kept) == count:
            break
        chain = _chain(r, world, by_kind, pages_by_level[r.choice(levels)])
        if chain is None:
            rejected["dead_end"] += 1
            continue
        q = compose(*chain)
        why = "duplicate" if q.question in seen else rejection(q, prior, call)
        if why:
            rejected[why] += 1
            continue
        seen.add(q.question)
        q.id, q.distractors = f"search-{seed}-{len(kept):04d}", distractors(q, call)
        kept.append(q)
    return kept, rejected
