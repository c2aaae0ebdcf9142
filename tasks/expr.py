"""A tiny exact arithmetic-expression language for countdown answers.

Grammar (whitespace allowed between tokens, no unary minus):

    expr   := term (('+' | '-') term)*
    term   := factor (('*' | '/') factor)*
    factor := INT | '(' expr ')'

Parsed by recursive descent, never `eval`; evaluated with `fractions.Fraction`
so division is exact. Input length, literal size and nesting depth are capped,
so hostile input fails fast with `ExprError` instead of exhausting the stack.
Trees are tuples `(op, left, right)` or int leaves; `render` writes one with the
fewest parentheses that keep its value.
"""

from __future__ import annotations

import re
from fractions import Fraction

MAX_LEN = 256
MAX_DEPTH = 32
_TOKEN = re.compile(r"\s*(?:([0-9]{1,9})|([-+*/()]))")
_PREC = {"+": 1, "-": 1, "*": 2, "/": 2}


class ExprError(ValueError):
    """Malformed, oversized or undefined (division by zero) expression."""


def tokenize(text: str) -> list[str]:
    if len(text) > MAX_LEN:
        raise ExprError(f"expression longer than {MAX_LEN} characters")
    tokens, pos, end = [], 0, len(text.rstrip())
    while pos < end:
        m = _TOKEN.match(text, pos)
        if m is None:
            raise ExprError(f"unexpected character at {pos}")
        tokens.append(m.group(1) or m.group(2))
        pos = m.end()
    return tokens


class _Parser:
    def __init__(self, tokens: list[str]):
        self.tokens, self.i, self.literals = tokens, 0, []

    def peek(self) -> str | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self) -> str:
        tok = self.peek()
        if tok is None:
            raise ExprError("unexpected end of expression")
        self.i += 1
        return tok

    def expr(self, depth: int) -> Fraction:
        value = self.term(depth)
        while self.peek() in ("+", "-"):
            op, rhs = self.take(), self.term(depth)
            value = value + rhs if op == "+" else value - rhs
        return value

    def term(self, depth: int) -> Fraction:
        value = self.factor(depth)
        while self.peek() in ("*", "/"):
            op, rhs = self.take(), self.factor(depth)
            if op == "/" and rhs == 0:
                raise ExprError("division by zero")
            value = value * rhs if op == "*" else value / rhs
        return value

    def factor(self, depth: int) -> Fraction:
        tok = self.take()
        if tok == "(":
            if depth >= MAX_DEPTH:
                raise ExprError(f"nesting deeper than {MAX_DEPTH}")
            value = self.expr(depth + 1)
            if self.take() != ")":
                raise ExprError("expected ')'")
            return value
        if tok.isdigit():
            self.literals.append(int(tok))
            return Fraction(int(tok))
        raise ExprError(f"unexpected token {tok!r}")


def evaluate(text: str) -> tuple[Fraction, list[int]]:
    """(exact value, integer literals in order of appearance); raises ExprError."""
    if not isinstance(text, str):
        raise ExprError("expression must be a string")
    parser = _Parser(tokenize(text))
    value = parser.expr(0)
    if parser.peek() is not None:
        raise ExprError(f"unexpected token {parser.peek()!r}")
    return value, parser.literals


def render(tree, parent_prec: int = 0, right_of: str | None = None) -> str:
    """Infix text with minimal parentheses: a child is wrapped when it binds
    looser than its parent, or equally tight on the right of '-' or '/'."""
    if isinstance(tree, int):
        return str(tree)
    op, left, right = tree
    prec = _PREC[op]
    text = render(left, prec) + op + render(right, prec, op)
    if prec < parent_prec or (prec == parent_prec and right_of in ("-", "/")):
        return f"({text})"
    return text
