"""AST-located, text-level bug injection: each mutation edits a few characters of the source
so the gold patch (the reverse edit) is as small as a real one-line fix.

Operators (SWE-smith's families): off-by-one (`<`↔`<=`, integer constant ±1), inverted
condition (`==`↔`!=`, `is`↔`is not`, `in`↔`not in`, `and`↔`or`, `if c` → `if not c`), wrong
default (a parameter's default constant), dropped branch (an `else:` block or a guard `if`
removed), swapped arguments (first two positional arguments of a call).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

COMPARE_FLIPS = {ast.Lt: ("<", "<="), ast.LtE: ("<=", "<"), ast.Gt: (">", ">="),
                 ast.GtE: (">=", ">"), ast.Eq: ("==", "!="), ast.NotEq: ("!=", "=="),
                 ast.Is: ("is not", "is"), ast.IsNot: ("is not", "is"),
                 ast.In: ("not in", "in"), ast.NotIn: ("not in", "in")}
OFF_BY_ONE_OPS = (ast.Lt, ast.LtE, ast.Gt, ast.GtE)


@dataclass(frozen=True)
class Mutation:
    path: str  # file, relative to the project root
    function: str  # qualified name of the enclosing function
    operator: str  # off_by_one | inverted_condition | wrong_default | dropped_branch | swapped_args
    detail: str
    line: int
    col: int
    source: str  # the whole mutated file

    @property
    def key(self) -> tuple[str, int, int, str, str]:
        return (self.path, self.line, self.col, self.operator, self.detail)


class _Editor:
    """Position helpers over one file's text (ast columns are UTF-8 byte offsets)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.lines = text.splitlines(keepends=True)
        self.starts = [0]
        for line in self.lines:
            self.starts.append(self.starts[-1] + len(line))

    def offset(self, line: int, col: int) -> int:
        raw = self.lines[line - 1].encode()[:col].decode(errors="ignore")
        return self.starts[line - 1] + len(raw)

    def span(self, node: ast.AST) -> tuple[int, int]:
        return (self.offset(node.lineno, node.col_offset),  # type: ignore[attr-defined]
                self.offset(node.end_lineno, node.end_col_offset))  # type: ignore[attr-defined]

    def replace(self, start: int, end: int, new: str) -> str:
        return self.text[:start] + new + self.text[end:]

    def drop_lines(self, first: int, last: int) -> str:
        return "".join(self.lines[:first - 1] + self.lines[last:])


def _one_line(node: ast.AST) -> bool:
    return getattr(node, "lineno", 0) == getattr(node, "end_lineno", -1)


def _functions(tree: ast.Module) -> list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    found: list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found.append((prefix + child.name, child))
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")

    visit(tree, "")
    return found


def _in_function(fn: ast.AST) -> list[ast.AST]:
    """Nodes of a function body, not descending into nested functions or classes."""
    out: list[ast.AST] = []
    stack = list(getattr(fn, "body", []))
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        out.append(node)
        stack.extend(ast.iter_child_nodes(node))
    return out


def _compare(ed: _Editor, node: ast.Compare) -> list[tuple[str, str, str]]:
    if len(node.ops) != 1 or not _one_line(node):
        return []
    op = type(node.ops[0])
    old, new = COMPARE_FLIPS[op]
    if op in (ast.Is, ast.In):
        old, new = new, old
    start = ed.span(node.left)[1]
    end = ed.span(node.comparators[0])[0]
    gap = ed.text[start:end]
    pattern = r"\s*".join(re.escape(w) for w in old.split()) if " " in old else re.escape(old)
    if op in (ast.Is, ast.In):
        pattern = rf"\b{pattern}\b"
    match = re.search(pattern, gap)
    if not match:
        return []
    kind = "off_by_one" if op in OFF_BY_ONE_OPS else "inverted_condition"
    text = ed.replace(start + match.start(), start + match.end(), new)
    return [(kind, f"{old.strip()} -> {new}", text)]


def _boolop(ed: _Editor, node: ast.BoolOp) -> list[tuple[str, str, str]]:
    if len(node.values) != 2 or not _one_line(node):
        return []
    old, new = ("and", "or") if isinstance(node.op, ast.And) else ("or", "and")
    start, end = ed.span(node.values[0])[1], ed.span(node.values[1])[0]
    match = re.search(rf"\b{old}\b", ed.text[start:end])
    if not match:
        return []
    return [("inverted_condition", f"{old} -> {new}",
             ed.replace(start + match.start(), start + match.end(), new))]


def _constant(ed: _Editor, node: ast.Constant) -> list[tuple[str, str, str]]:
    if type(node.value) is not int or not _one_line(node):
        return []
    start, end = ed.span(node)
    if ed.text[start:end] != str(node.value):
        return []  # hex, underscores, ...: leave alone
    out = [("off_by_one", f"{node.value} -> {node.value + 1}",
            ed.replace(start, end, str(node.value + 1)))]
    if node.value >= 1:
        out.append(("off_by_one", f"{node.value} -> {node.value - 1}",
                    ed.replace(start, end, str(node.value - 1))))
    return out


def _invert_if(ed: _Editor, node: ast.If) -> list[tuple[str, str, str]]:
    test = node.test
    if not _one_line(test):
        return []
    start, end = ed.span(test)
    seg = ed.text[start:end]
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner_start, inner_end = ed.span(test.operand)
        new = ed.text[inner_start:inner_end]
    else:
        atomic = isinstance(test, (ast.Name, ast.Attribute, ast.Call, ast.Subscript))
        new = f"not {seg}" if atomic else f"not ({seg})"
    return [("inverted_condition", f"if {seg[:40]} -> if {new[:44]}", ed.replace(start, end, new))]


def _drop_branch(ed: _Editor, node: ast.If, siblings: list[ast.stmt]) -> list[tuple[str, str, str]]:
    out = []
    orelse = node.orelse
    if orelse and not (len(orelse) == 1 and isinstance(orelse[0], ast.If)
                       and ed.lines[orelse[0].lineno - 1].lstrip().startswith("elif")):
        else_line = orelse[0].lineno - 1
        body_end = node.body[-1].end_lineno or node.body[-1].lineno
        if ed.lines[else_line - 1].strip() == "else:" and else_line > body_end:
            last = orelse[-1].end_lineno
            assert last is not None
            out.append(("dropped_branch", f"else branch of line {node.lineno}",
                        ed.drop_lines(else_line, last)))
    if not orelse and len(siblings) > 1 and node.end_lineno is not None:
        first_line = ed.lines[node.lineno - 1]
        if first_line.lstrip().startswith("if ") and all(
                s is node or s.end_lineno < node.lineno or s.lineno > node.end_lineno  # type: ignore[operator]
                for s in siblings):
            out.append(("dropped_branch", f"if block at line {node.lineno}",
                        ed.drop_lines(node.lineno, node.end_lineno)))
    return out


def _swap_args(ed: _Editor, node: ast.Call) -> list[tuple[str, str, str]]:
    args = node.args
    if len(args) < 2 or not _one_line(node) or any(isinstance(a, ast.Starred) for a in args[:2]):
        return []
    (a0, a1), (b0, b1) = ed.span(args[0]), ed.span(args[1])
    first, second = ed.text[a0:a1], ed.text[b0:b1]
    if first == second:
        return []
    text = ed.text[:a0] + second + ed.text[a1:b0] + first + ed.text[b1:]
    return [("swapped_args", f"({first[:20]}, {second[:20]}) swapped", text)]


def _defaults(ed: _Editor,
              fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[tuple[str, str, str]]:
    out = []
    for default in [*fn.args.defaults, *(d for d in fn.args.kw_defaults if d is not None)]:
        if not isinstance(default, ast.Constant) or not _one_line(default):
            continue
        start, end = ed.span(default)
        value = default.value
        if isinstance(value, bool):
            new = str(not value)
        elif type(value) is int and ed.text[start:end] == str(value):
            new = str(value + 1)
        else:
            continue
        out.append(("wrong_default", f"default {ed.text[start:end]} -> {new}",
                    ed.replace(start, end, new)))
    return out


def _statement_lists(fn: ast.AST) -> list[list[ast.stmt]]:
    lists = []
    for node in [fn, *_in_function(fn)]:
        for name in ("body", "orelse", "finalbody"):
            block = getattr(node, name, None)
            if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                lists.append(block)
    return lists


def mutations(path: str, text: str) -> list[Mutation]:
    """Every candidate mutation of one module, in a stable order; each parses and differs."""
    tree = ast.parse(text)
    ed = _Editor(text)
    original = ast.dump(tree)
    found: dict[tuple, Mutation] = {}
    for qualname, fn in _functions(tree):
        edits: list[tuple[ast.AST, tuple[str, str, str]]] = []
        edits += [(fn, e) for e in _defaults(ed, fn)]
        for node in _in_function(fn):
            if isinstance(node, ast.Compare):
                edits += [(node, e) for e in _compare(ed, node)]
            elif isinstance(node, ast.BoolOp):
                edits += [(node, e) for e in _boolop(ed, node)]
            elif isinstance(node, ast.Constant):
                edits += [(node, e) for e in _constant(ed, node)]
            elif isinstance(node, ast.Call):
                edits += [(node, e) for e in _swap_args(ed, node)]
            elif isinstance(node, ast.If):
                edits += [(node, e) for e in _invert_if(ed, node)]
        for block in _statement_lists(fn):
            for stmt in block:
                if isinstance(stmt, ast.If):
                    edits += [(stmt, e) for e in _drop_branch(ed, stmt, block)]
        for node, (operator, detail, new_text) in edits:
            try:
                if ast.dump(ast.parse(new_text)) == original:
                    continue
            except SyntaxError:
                continue
            m = Mutation(path, qualname, operator, detail, getattr(node, "lineno", 0),
                         getattr(node, "col_offset", 0), new_text)
            found.setdefault(m.key, m)
    return [found[k] for k in sorted(found)]
