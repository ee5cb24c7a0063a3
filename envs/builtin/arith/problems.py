"""Deterministic arithmetic problems: the same (seed, count, families) always gives the same list.

Three families, from easy to hard, so one task set holds problems a small model solves sometimes
and problems it rarely solves (room for RL to improve on both):
- `expression`: "What is 37 * 12 - 45?" — one calculation, the expression copied from the question;
- `two_step`: "Multiply 37 by 12, then subtract 45 from the result." — the second calculation
  uses the first one's result;
- `word`: word problems needing three calculations over several turns.
Every problem is solved by calculator calls and then `submit`, so a model that uses the
calculator works over several turns. Values are chosen so every answer is a whole number.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    id: str
    question: str
    answer: int
    steps: list[str]  # the calculations of the gold solution, in order
    family: str = ""  # expression | two_step | word


def _shop(r: random.Random) -> Problem:
    boxes, per_box = r.randint(3, 19), r.randint(6, 24)
    sold, extra = r.randint(5, 40), r.randint(2, 9)
    answer = boxes * per_box - sold + extra * per_box
    q = (f"A shop has {boxes} boxes with {per_box} pencils in each box. It sells {sold} "
         f"pencils, then receives {extra} more boxes of {per_box} pencils. How many pencils "
         "does it have now?")
    return Problem("", q, answer, [f"{boxes} * {per_box}", f"{extra} * {per_box}",
                                   f"{boxes * per_box} - {sold} + {extra * per_box}"])


def _savings(r: random.Random) -> Problem:
    friends = r.randint(2, 6)
    weekly, weeks = r.randint(5, 40), r.randint(3, 12)
    total = weekly * weeks
    spent = r.randint(1, total - friends)
    spent += (total - spent) % friends  # the rest splits evenly
    answer = (total - spent) // friends
    q = (f"Maya saves {weekly} dollars every week for {weeks} weeks. She spends {spent} "
         f"dollars on a bike and shares the rest equally among {friends} friends. How many "
         "dollars does each friend get?")
    return Problem("", q, answer, [f"{weekly} * {weeks}", f"{total} - {spent}",
                                   f"{total - spent} / {friends}"])


def _trip(r: random.Random) -> Problem:
    s1, h1, s2, h2 = r.randint(40, 120), r.randint(1, 6), r.randint(30, 110), r.randint(1, 5)
    answer = s1 * h1 + s2 * h2
    q = (f"A train travels at {s1} km/h for {h1} hours and then at {s2} km/h for {h2} hours. "
         "How many kilometres does it travel in total?")
    return Problem("", q, answer, [f"{s1} * {h1}", f"{s2} * {h2}", f"{s1 * h1} + {s2 * h2}"])


def _orchard(r: random.Random) -> Problem:
    rows, per_row = r.randint(4, 30), r.randint(5, 25)
    percent = r.choice([10, 20, 25, 40, 50, 60, 75, 80])
    trees = rows * per_row
    while trees * percent % 100:
        rows += 1
        trees = rows * per_row
    apples = trees * percent // 100
    price = r.randint(2, 15)
    answer = apples * price
    q = (f"An orchard has {rows} rows of {per_row} trees. {percent}% of the trees are apple trees, "
         f"and each apple tree yields {price} kg of apples. How many kg of apples does the "
         "orchard yield?")
    return Problem("", q, answer, [f"{rows} * {per_row}", f"{trees} * {percent} / 100",
                                   f"{apples} * {price}"])


def _tickets(r: random.Random) -> Problem:
    adults, children = r.randint(2, 40), r.randint(2, 60)
    adult_price, child_price = r.randint(8, 30), r.randint(3, 12)
    discount = r.randint(1, 5) * 5
    answer = adults * adult_price + children * child_price - discount
    q = (f"A museum sells {adults} adult tickets at {adult_price} dollars and {children} child "
         f"tickets at {child_price} dollars. A group discount takes {discount} dollars off the "
         "total. How much money does the museum collect?")
    total = f"{adults * adult_price} + {children * child_price} - {discount}"
    return Problem("", q, answer,
                   [f"{adults} * {adult_price}", f"{children} * {child_price}", total])


_OPS = {"+": ("add", "to"), "-": ("subtract", "from")}


def _operands(r: random.Random) -> tuple[int, int, int, str, int]:
    """a (2 digits), b (1 digit), c (2 digits), + or -, and a * b + c or a * b - c (always a
    positive whole number). Fixed widths keep the token layout of a question constant, which
    a tiny model learns to copy from much sooner than numbers of varying length."""
    a, b, op = r.randint(10, 99), r.randint(2, 9), r.choice("+-")
    c = r.randint(10, min(99, a * b - 1))
    return a, b, c, op, a * b + c if op == "+" else a * b - c


def _expression(r: random.Random) -> Problem:
    a, b, c, op, answer = _operands(r)
    expression = f"{a} * {b} {op} {c}"
    return Problem("", f"What is {expression}?", answer, [expression])


def _two_step(r: random.Random) -> Problem:
    a, b, c, op, answer = _operands(r)
    verb, prep = _OPS[op]
    q = f"Multiply {a} by {b}, then {verb} {c} {prep} the result. What number do you get?"
    return Problem("", q, answer, [f"{a} * {b}", f"{a * b} {op} {c}"])


FAMILIES: dict[str, list[Callable[[random.Random], Problem]]] = {
    "expression": [_expression],
    "two_step": [_two_step],
    "word": [_shop, _savings, _trip, _orchard, _tickets],
}


def generate(seed: int, count: int, families: Sequence[str] = tuple(FAMILIES)) -> list[Problem]:
    """`count` problems from `seed`, each from a family drawn uniformly from `families` (then a
    template uniformly within it); ids are `arith-<seed>-<index>`."""
    unknown = [f for f in families if f not in FAMILIES]
    if unknown or not families:
        raise ValueError(f"unknown arith families {unknown}; choose from {sorted(FAMILIES)}")
    r = random.Random(seed)
    problems = []
    for i in range(count):
        family = r.choice(list(families))
        p = r.choice(FAMILIES[family])(r)
        problems.append(Problem(f"arith-{seed}-{i:04d}", p.question, p.answer, p.steps, family))
    return problems
