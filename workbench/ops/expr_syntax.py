"""Syntax of the expression language: tokenizer, recursive-descent parser and frozen AST.

Grammar (see `expr_lang` for what a statement means):

    statement := ref ASSIGN expr END          ASSIGN := = | += | *= | max= | min=
    expr      := term (('+' | '-') term)*     term   := unary (('*' | '/') unary)*
    unary     := '-' unary | NUMBER | NAME '(' expr (',' expr)* ')' | ref | '(' expr ')'
    ref       := NAME '[' index (',' index)* ']'
    index     := an integer-affine expression of axis names (c * axis, +, -, integer constants)

Nothing here hands text to Python's eval/exec/ast; the tokens are matched by regular expressions.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from workbench.errors import UserError
from workbench.ops.shapes import MAX_ELEMENTS

FUNCTIONS = {"max": 2, "min": 2, "exp": 1, "sqrt": 1, "tanh": 1, "abs": 1, "sigmoid": 1, "log": 1}
REDUCING = ("+=", "*=", "max=", "min=")
# "expr" is the key the expression text is stored under in TensorExpr.params, next to the extents.
RESERVED = frozenset(FUNCTIONS) | {"expr"}
# Bounds that keep the parser and every walk over the AST (TE building, the numpy reference) far
# from Python's recursion limit; real operators use a few dozen operations at most.
MAX_LENGTH = 4000  # characters
MAX_DEPTH = 100  # nesting of parentheses and unary minus
MAX_OPERATIONS = 256  # binary operators, negations and calls
# Index coefficients and constants become int32 arithmetic on TVM's loop variables (the extents
# are int32, see shapes.MAX_ELEMENTS); a larger one would overflow or be refused by TVM.
MAX_INDEX_TERM = MAX_ELEMENTS

_TOKEN = re.compile(
    r"(?P<space>\s+)"
    r"|(?P<number>(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)"
    r"|(?P<assign>(?:max|min)=(?!=)|\+=|\*=)"
    r"|(?P<name>[A-Za-z_][A-Za-z0-9_]*)"
    r"|(?P<op>[-+*/()\[\],=])"
)


@dataclass(frozen=True)
class Token:
    kind: str  # "number" | "assign" | "name" | "op" | "end"
    text: str
    column: int  # 1-based


@dataclass(frozen=True)
class Index:
    """An affine index `sum(coeff * axis) + const`; terms in order of first appearance."""

    terms: tuple[tuple[str, int], ...]
    const: int
    column: int

    def __str__(self) -> str:
        parts = [a if c == 1 else f"{c}*{a}" for a, c in self.terms] + ([str(self.const)] if self.const else [])
        return "+".join(parts).replace("+-", "-") or "0"


@dataclass(frozen=True)
class Number:
    value: float
    column: int


@dataclass(frozen=True)
class Ref:
    tensor: str
    indices: tuple[Index, ...]
    column: int


@dataclass(frozen=True)
class Call:
    func: str
    args: tuple[Expr, ...]
    column: int


@dataclass(frozen=True)
class Binary:
    op: str  # + - * /
    left: Expr
    right: Expr
    column: int


@dataclass(frozen=True)
class Negate:
    operand: Expr
    column: int


Expr = Number | Ref | Call | Binary | Negate


def fail(message: str) -> UserError:
    """A UserError about the expression."""
    return UserError(f"expression: {message}")


def tokenize(text: str) -> tuple[Token, ...]:
    """Split `text` into tokens; an unknown character is an error naming its column."""
    if len(text) > MAX_LENGTH:
        raise fail(f"longer than {MAX_LENGTH} characters")
    tokens, pos = [], 0
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if match is None:
            raise fail(f"unknown character {text[pos]!r} at column {pos + 1}")
        if match.lastgroup != "space":
            tokens.append(Token(match.lastgroup, match.group(), pos + 1))
        pos = match.end()
    return tuple(tokens) + (Token("end", "", len(text) + 1),)


class _Parser:
    """Recursive descent over the token tuple; one method per grammar rule."""

    def __init__(self, tokens: tuple[Token, ...]):
        self.tokens, self.pos, self.depth, self.operations = tokens, 0, 0, 0

    @property
    def peek(self) -> Token:
        return self.tokens[self.pos]

    def take(self) -> Token:
        token = self.tokens[self.pos]
        self.pos += 1
        return token

    def expect(self, text: str, after: str) -> Token:
        if self.peek.text != text or self.peek.kind not in ("op", "assign"):
            raise fail(f"expected '{text}' {after}, got {_show(self.peek)} at column {self.peek.column}")
        return self.take()

    def statement(self) -> tuple[Ref, str, Expr]:
        first = self.peek
        if first.kind != "name" or self.tokens[self.pos + 1].text != "[":
            raise fail(f"expected an output tensor NAME[...] at column {first.column}, got {_show(first)}")
        target = self.ref(self.take())
        op = self.take()
        if op.kind != "assign" and op.text != "=":
            raise fail(f"expected =, +=, *=, max= or min= at column {op.column}, got {_show(op)}")
        value = self.expr()
        if self.peek.kind != "end":
            raise fail(f"unexpected {_show(self.peek)} at column {self.peek.column}")
        return target, op.text, value

    def nest(self, column: int) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise fail(f"nested deeper than {MAX_DEPTH} levels at column {column}")

    def operation(self, column: int) -> None:
        self.operations += 1
        if self.operations > MAX_OPERATIONS:
            raise fail(f"more than {MAX_OPERATIONS} operations (at column {column})")

    def expr(self) -> Expr:
        self.nest(self.peek.column)
        node = self.term()
        while self.peek.text in ("+", "-") and self.peek.kind == "op":
            op = self.take()
            self.operation(op.column)
            node = Binary(op.text, node, self.term(), op.column)
        self.depth -= 1
        return node

    def term(self) -> Expr:
        node = self.unary()
        while self.peek.text in ("*", "/") and self.peek.kind == "op":
            op = self.take()
            self.operation(op.column)
            node = Binary(op.text, node, self.unary(), op.column)
        return node

    def unary(self) -> Expr:
        token = self.take()
        if token.text == "-" and token.kind == "op":
            self.nest(token.column)
            self.operation(token.column)
            node = Negate(self.unary(), token.column)
            self.depth -= 1
            return node
        if token.kind == "number":
            value = float(token.text)
            if not math.isfinite(value):
                raise fail(f"number {token.text} at column {token.column} is beyond the range of every float type")
            return Number(value, token.column)
        if token.text == "(" and token.kind == "op":
            node = self.expr()
            self.expect(")", f"to close the '(' of column {token.column}")
            return node
        if token.kind == "name" and self.peek.text == "(":
            return self.call(token)
        if token.kind == "name" and self.peek.text == "[":
            return self.ref(token)
        if token.kind == "name":
            raise fail(f"{token.text!r} at column {token.column} is neither a tensor NAME[...] nor a call NAME(...)")
        raise fail(f"expected a number, tensor or call at column {token.column}, got {_show(token)}")

    def call(self, name: Token) -> Call:
        if name.text not in FUNCTIONS:
            raise fail(f"unknown function {name.text!r} at column {name.column}; known: {', '.join(FUNCTIONS)}")
        self.operation(name.column)
        self.take()
        args = [self.expr()]
        while self.peek.text == ",":
            self.take()
            args.append(self.expr())
        self.expect(")", f"to close the call of {name.text} from column {name.column}")
        if len(args) != FUNCTIONS[name.text]:
            raise fail(f"{name.text} takes {FUNCTIONS[name.text]} argument(s), got {len(args)} at column {name.column}")
        return Call(name.text, tuple(args), name.column)

    def ref(self, name: Token) -> Ref:
        if name.text in RESERVED:
            raise fail(f"{name.text!r} is a reserved name, not a tensor (column {name.column})")
        self.expect("[", f"after tensor {name.text}")
        indices = [self.index()]
        while self.peek.text == ",":
            self.take()
            indices.append(self.index())
        self.expect("]", f"to close the index of {name.text} from column {name.column}")
        return Ref(name.text, tuple(indices), name.column)

    def index(self) -> Index:
        column = self.peek.column
        terms, const = _Affine(self).sum()
        for what, value in [(f"coefficient of {a}", c) for a, c in terms.items()] + [("constant", const)]:
            if abs(value) > MAX_INDEX_TERM:
                raise fail(f"index {what} at column {column} is {value}, beyond the int32 index range "
                           f"(at most {MAX_INDEX_TERM} in size)")
        return Index(tuple((a, c) for a, c in terms.items() if c), const, column)


class _Affine:
    """Index expressions: linear forms ({axis: coeff}, const); anything else is non-affine."""

    def __init__(self, parser: _Parser):
        self.p = parser

    def sum(self) -> tuple[dict[str, int], int]:
        terms, const = self.product()
        while self.p.peek.text in ("+", "-") and self.p.peek.kind == "op":
            sign = 1 if self.p.take().text == "+" else -1
            more, c = self.product()
            terms = _add(terms, more, sign)
            const += sign * c
        return terms, const

    def product(self) -> tuple[dict[str, int], int]:
        terms, const = self.atom()
        while self.p.peek.text in ("*", "/") and self.p.peek.kind == "op":
            op = self.p.take()
            if op.text == "/":
                raise fail(f"non-affine index: division at column {op.column}")
            more, c = self.atom()
            if terms and more:
                raise fail(f"non-affine index: product of axes at column {op.column}")
            # One side is a constant, so this is the plain product of the two linear forms.
            terms = {a: k * c for a, k in terms.items()} | {a: k * const for a, k in more.items()}
            const *= c
        return terms, const

    def atom(self) -> tuple[dict[str, int], int]:
        token = self.p.take()
        if token.text == "-" and token.kind == "op":
            self.p.nest(token.column)
            terms, const = self.atom()
            self.p.depth -= 1
            return {a: -k for a, k in terms.items()}, -const
        if token.kind == "number":
            if not token.text.isdigit():
                raise fail(f"index constants must be integers, got {token.text!r} at column {token.column}")
            return {}, int(token.text)
        if token.text == "(" and token.kind == "op":
            self.p.nest(token.column)
            form = self.sum()
            self.p.depth -= 1
            self.p.expect(")", f"to close the '(' of column {token.column}")
            return form
        if token.kind == "name" and self.p.peek.text in ("[", "("):
            what = "tensor" if self.p.peek.text == "[" else "call"
            raise fail(f"non-affine index: {what} {token.text!r} inside an index at column {token.column}")
        if token.kind == "name":
            if token.text in RESERVED:
                raise fail(f"{token.text!r} is a reserved name, not an axis (column {token.column})")
            return {token.text: 1}, 0
        raise fail(f"expected an index at column {token.column}, got {_show(token)}")


def _add(left: dict[str, int], right: dict[str, int], sign: int) -> dict[str, int]:
    out = dict(left)
    for axis, coeff in right.items():
        out[axis] = out.get(axis, 0) + sign * coeff
    return out


def _show(token: Token) -> str:
    return "the end" if token.kind == "end" else repr(token.text)


def parse_statement(text: str) -> tuple[Ref, str, Expr]:
    """Parse `text` into (target, assignment operator, right side); no meaning is checked here."""
    return _Parser(tokenize(text)).statement()
