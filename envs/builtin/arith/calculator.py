"""Safe arithmetic: parses with `ast` and evaluates only numbers and + - * / // % ** ( ).

No names, calls or attributes are ever evaluated, so a model cannot run code through it; sizes
are bounded so `9**9**9` is an error, not a hang.
"""

from __future__ import annotations

import ast
import math
import operator
import re
from fractions import Fraction

MAX_EXPRESSION_CHARS = 200
MAX_EXPONENT = 64
MAX_MAGNITUDE = Fraction(10) ** 30
# numerator and denominator of every value, at most (~300 digits): each operation on such
# values costs microseconds, and a power is refused before it would pass it
MAX_BITS = 1024
TOO_PRECISE = "result too small or too precise (more than ~300 digits in a fraction)"
# A submitted answer is read only this long, with a decimal exponent only this large:
# Fraction("1e20000000") would build a 20-million-digit integer (17 s of the runner's loop).
MAX_ANSWER_CHARS = 100
MAX_ANSWER_EXPONENT = 100
# The answers parse_answer reads: a subset of what Fraction() parses (no underscores, no
# non-ASCII digits, no exponent on a numerator/denominator pair), so that checking `exp` bounds
# the value Fraction builds. Python's parsers take "1_0e9_9999_999" (10^999,999,999).
ANSWER = re.compile(r"[+-]?(?:\d+/\d+|(?:\d+(?:\.\d*)?|\.\d+)(?:[eE](?P<exp>[+-]?\d+))?)",
                    re.ASCII)

_BINARY = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
}


class CalculatorError(ValueError):
    """The expression is not plain arithmetic, or its value is out of range."""


def evaluate(expression: str) -> Fraction:
    """Exact value of an arithmetic expression (fractions, never floats)."""
    text = expression.strip().replace(",", "").replace("^", "**").replace("×", "*")
    if not text:
        raise CalculatorError("empty expression; pass e.g. '12 * (3 + 4)'")
    if len(text) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        raise CalculatorError(f"not an arithmetic expression: {expression!r}") from None
    return _eval(tree.body)


def _eval(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float) \
            and not isinstance(node.value, bool):
        if not math.isfinite(node.value):  # a literal past float's range: 1e999 is inf
            raise CalculatorError("result too large (more than 30 digits)")
        return _bounded(Fraction(str(node.value)))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _eval(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
        base, exponent = _eval(node.left), _eval(node.right)
        if exponent.denominator != 1 or abs(exponent) > MAX_EXPONENT:
            raise CalculatorError(f"exponents must be whole numbers up to {MAX_EXPONENT}")
        if base == 0 and exponent < 0:
            raise CalculatorError("division by zero")
        # bounded before it is computed: a tiny value can hold a huge denominator, and chained
        # powers multiply (((2**-64)**64)**64)**64 is a 2**-16,777,216 of 2 MB, one more 8 GB)
        if _bits(base) * abs(int(exponent)) > MAX_BITS:
            raise CalculatorError(TOO_PRECISE)
        return _bounded(base ** int(exponent))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) and right == 0:
            raise CalculatorError("division by zero")
        return _bounded(Fraction(_BINARY[type(node.op)](left, right)))
    raise CalculatorError("only numbers, + - * / // % ** and parentheses are allowed")


def _bits(value: Fraction) -> int:
    return max(value.numerator.bit_length(), value.denominator.bit_length())


def _bounded(value: Fraction) -> Fraction:
    if abs(value) > MAX_MAGNITUDE:
        raise CalculatorError("result too large (more than 30 digits)")
    if _bits(value) > MAX_BITS:
        raise CalculatorError(TOO_PRECISE)
    return value


def format_number(value: Fraction) -> str:
    """Integers print as integers; other values as a decimal with up to 10 places."""
    if value.denominator == 1:
        return str(value.numerator)
    return f"{float(value):.10f}".rstrip("0").rstrip(".")


def parse_answer(text: str) -> Fraction | None:
    """A submitted answer as a number: tolerates spaces, thousands separators, a leading '$'
    and a trailing period; anything else, and anything too long or with an exponent too large to
    parse cheaply, is not a number (None). What is bounded is what is parsed: an answer is read
    only when it matches ANSWER (ASCII digits, no underscores, an exponent only on a decimal),
    whose exponent group is then the number's own exponent."""
    cleaned = text.strip().replace(",", "").removeprefix("$").rstrip(".").strip()
    found = ANSWER.fullmatch(cleaned) if len(cleaned) <= MAX_ANSWER_CHARS else None
    if found is None or (found["exp"] is not None
                         and abs(int(found["exp"])) > MAX_ANSWER_EXPONENT):
        return None
    try:
        return Fraction(cleaned)
    except (ValueError, ZeroDivisionError):  # 1/0
        return None
