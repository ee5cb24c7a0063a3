"""Screening answers that a dataset's scorer would run as Python.

Several reasoning-gym scorers evaluate the answer: plain `eval(answer)` (spiral_matrix,
string_insertion, binary_matrix, n_queens) or sympy's `parse_expr` (polynomial_multiplication,
simple/intermediate_integration, countdown, puzzle24), which ends in `eval` too. The answer comes
from the model, an adversary optimising its reward: `__import__('os').write(1, ...)` once forged
the worker's reply. So, host-side and before the worker sees it, an answer to such a dataset must
be a plain expression: numbers, strings (plain `eval` only: sympy parses a string argument as
code), lists/tuples, arithmetic, names (for sympy: from NAMES or of one letter, the datasets'
variables), calls to FUNCTIONS only. No attributes, subscripts, lambdas, comprehensions, keywords.

Which datasets: those whose `score_answer` (with the methods and module functions it names; for
`composite`, the entry's source dataset's) calls eval/exec/compile or sympy's parse_expr/
sympify. The rest never run the answer and are not screened (propositional_logic has a
`parse_expr` of its own: a parser, not sympy's). A scorer whose source cannot be read is screened
strictly.
"""

from __future__ import annotations

import ast
import inspect
import io
import re
import sys
import tokenize
from functools import lru_cache
from typing import Any, Literal

Mode = Literal["eval", "sympy"]
MAX_NODES, MAX_DEPTH = 2000, 60
# what legitimate answers hold: the integration datasets' antiderivatives (exp, sin, log, sqrt,
# atan, ... and C), polynomials, countdown/puzzle24 arithmetic, lists of numbers or letters
FUNCTIONS = frozenset({"sin", "cos", "tan", "cot", "sec", "csc", "asin", "acos", "atan",
                       "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "exp", "log", "ln",
                       "sqrt", "Abs", "abs", "Integral"})
NAMES = FUNCTIONS | {"pi", "E", "I", "oo"}
_EVAL = re.compile(r"(?<![\w.])(?:eval|exec|compile)\s*\(")
_SYMPY = re.compile(r"\b(?:sp|sympy)\.(?:parse_expr|sympify|S|simplify|expand)\s*\(")
_SYMPY_NAMES = frozenset({"parse_expr", "sympify", "S", "simplify", "expand"})
_OPS = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow, ast.UAdd,
        ast.USub)
_PLAIN = (ast.Expression, ast.Constant, ast.List, ast.Tuple, ast.BinOp, ast.UnaryOp, ast.Name,
          ast.Call, ast.Load, *_OPS)


def mode_for(dataset: Any, entry: dict[str, Any]) -> Mode | None:
    """How answers to this entry must be screened: "sympy" (strict), "eval", or None (the scorer
    never runs the answer)."""
    classes: list[Any] = [type(dataset)]
    source = (entry.get("metadata") or {}).get("source_dataset")
    if isinstance(source, str) and source != getattr(dataset, "name", None):
        from reasoning_gym.factory import DATASETS  # composite: the entry's own dataset scores

        if source in DATASETS:
            classes.append(DATASETS[source][0])
    modes = {_mode_of(cls) for cls in classes} - {None}
    return "sympy" if "sympy" in modes else ("eval" if modes else None)


@lru_cache(maxsize=256)
def _mode_of(cls: type) -> Mode | None:
    """The mode of a dataset class's score_answer, read from its source and the sources of the
    methods and module functions it names (transitively): eval/exec elsewhere in the module, in
    the generator, run the dataset's own text, not the answer (basic_arithmetic, codeio)."""
    method = getattr(cls, "score_answer", None)
    module = sys.modules.get(getattr(method, "__module__", "") or "")
    if method is None or module is None:
        return "sympy"
    found: set[str] = set()
    seen: set[str] = set()
    todo = [method]
    while todo:
        func = todo.pop()
        try:
            text = inspect.getsource(func)
        except (OSError, TypeError):
            return "sympy"  # unreadable: assume the worst
        if _SYMPY.search(text):
            found.add("sympy")
        for call in _EVAL.finditer(text):
            found.add("eval" if call.group().startswith("eval") else "exec")
        for name in set(re.findall(r"\b[A-Za-z_]\w*\b", text)) - seen:
            seen.add(name)
            target = getattr(cls, name, None) or vars(module).get(name)
            origin = getattr(target, "__module__", None) or ""
            if origin.startswith("sympy") and name in _SYMPY_NAMES:
                found.add("sympy")
            elif inspect.isfunction(target) and target.__module__.startswith("reasoning_gym"):
                todo.append(target)
    if "sympy" in found or "exec" in found:
        return "sympy"  # exec and compile take statements: only the strict screen is safe
    return "eval" if found else None


def _tokens_over(text: str, limit: int) -> bool | None:
    """Whether `text` holds more than `limit` Python tokens (counted no further); None when it
    does not tokenize. Counted before parsing: a parse deep enough to raise RecursionError
    needs far more tokens than MAX_NODES, and whether it raises depends on the interpreter's
    recursion limit at that moment, which must not decide a reward."""
    count = 0
    try:
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            if token.type not in _SILENT:
                count += 1
                if count > limit:
                    return True
    except (tokenize.TokenError, SyntaxError):  # IndentationError is a SyntaxError
        return None
    return False


_SILENT = frozenset({tokenize.NEWLINE, tokenize.NL, tokenize.ENDMARKER, tokenize.INDENT,
                     tokenize.DEDENT, tokenize.COMMENT})


def refusal(answer: str, mode: Mode) -> str | None:
    """Why `answer` may not reach a scorer of this mode, or None when it may."""
    if _tokens_over(answer.lstrip(" \t"), MAX_NODES):
        return "the answer expression is too large for the scorer"
    try:
        tree = ast.parse(answer.lstrip(" \t"), mode="eval")  # eval() strips these too
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        if mode == "eval":
            return None  # eval() fails on it the same way, before running anything
        return "the answer is not a plain expression (the scorer parses it as Python)"
    nodes = list(ast.walk(tree))
    if len(nodes) > MAX_NODES or _depth(tree) > MAX_DEPTH:
        return "the answer expression is too large for the scorer"
    for node in nodes:
        why = _refused_node(node, mode)
        if why:
            return f"the answer holds {why}, which the scorer would run as Python"
    return None


def _refused_node(node: ast.AST, mode: Mode) -> str | None:
    if not isinstance(node, _PLAIN):
        return f"a {type(node).__name__} expression"
    if isinstance(node, ast.Constant) and not isinstance(node.value, int | float | complex
                                                         | str):
        return f"the constant {node.value!r}"
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and mode == "sympy":
        return "a string"
    if isinstance(node, ast.Name) and not _name_ok(node.id, mode):
        return f"the name {node.id!r}"
    if isinstance(node, ast.Call) and (node.keywords or not isinstance(node.func, ast.Name)
                                       or node.func.id not in FUNCTIONS):
        return "a call other than a math function"
    return None


def _name_ok(name: str, mode: Mode) -> bool:
    """A bare name runs nothing (calls and attributes are refused apart): plain `eval` takes any
    but dunder-like ones (string_insertion's gold answer is an identifier); sympy's namespace is
    large, so there only NAMES and one-letter variables."""
    if mode == "eval":
        return not name.startswith("_")
    return name in NAMES or (len(name) == 1 and name.isascii() and name.isalpha())


def _depth(node: ast.AST) -> int:
    depth, level = 0, [node]
    while level:
        depth += 1
        if depth > MAX_DEPTH:
            return depth
        level = [c for n in level for c in ast.iter_child_nodes(n)]
    return depth
