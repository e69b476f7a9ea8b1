import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.errors import UserError
from workbench.ops.expr_syntax import (
    MAX_DEPTH,
    MAX_LENGTH,
    MAX_OPERATIONS,
    Binary,
    Call,
    Index,
    Negate,
    Number,
    Ref,
    parse_statement,
    tokenize,
)


def test_tokens_carry_columns():
    tokens = tokenize("B[i] max= A[i, j]")
    assert [(t.kind, t.text, t.column) for t in tokens[:6]] == [
        ("name", "B", 1), ("op", "[", 2), ("name", "i", 3), ("op", "]", 4), ("assign", "max=", 6), ("name", "A", 11),
    ]  # fmt: skip
    assert tokens[-1].kind == "end"


def test_matmul_ast():
    target, op, value = parse_statement("C[i,j] += A[i,k] * B[k,j]")
    assert target == Ref("C", (Index((("i", 1),), 0, 3), Index((("j", 1),), 0, 5)), 1)
    assert op == "+="
    assert isinstance(value, Binary) and value.op == "*"
    assert (value.left.tensor, value.right.tensor) == ("A", "B")


def test_precedence_unary_minus_and_calls():
    _, _, value = parse_statement("Y[i] = -A[i] + 2 * max(B[i], 0.5) / 4")
    assert isinstance(value, Binary) and value.op == "+"
    assert isinstance(value.left, Negate)
    assert value.right.op == "/" and value.right.left.op == "*"
    call = value.right.left.right
    assert isinstance(call, Call) and call.func == "max" and call.args[1] == Number(0.5, 30)


def test_affine_indices_are_linearised():
    _, _, value = parse_statement("O[h] += I[h*2 + r - 1, 3*(w - 2*s) + 7, -(-r), 4]")
    dims = [(dict(i.terms), i.const) for i in value.indices]
    assert dims == [({"h": 2, "r": 1}, -1), ({"w": 3, "s": -6}, 7), ({"r": 1}, 0), ({}, 4)]


@given(st.lists(st.integers(-4, 4), min_size=3, max_size=3), st.integers(0, 50))
def test_affine_index_property(coeffs, const):
    text = " + ".join(f"{c}*{a}" if c >= 0 else f"({c})*{a}" for c, a in zip(coeffs, "ijk")) + f" + {const}"
    _, _, value = parse_statement(f"B[i] += A[{text}]")
    index = value.indices[0]
    assert dict(index.terms) == {a: c for c, a in zip(coeffs, "ijk") if c}
    assert index.const == const


@pytest.mark.parametrize(
    "text, message",
    [
        ("C[i] = $A[i]", "expression: unknown character '$' at column 8"),
        ("C[i] = A[i]; import os", "unknown character ';' at column 12"),
        ("__import__('os').system('x')", 'unknown character "\'" at column 12'),
        ("C[i] = A[i].__class__", "unknown character '.' at column 12"),
        ("C[i] = __import__(A[i])", "expression: unknown function '__import__' at column 8"),
        ("C[i] = exec(A[i])", "unknown function 'exec'"),
        ("C[i] = A[i", "expected ']' to close the index of A from column 8, got the end at column 11"),
        ("C[i] = (A[i]", "expected ')' to close the '(' of column 8"),
        ("C[i] = A[i]]", "unexpected ']' at column 12"),
        ("C[i] = A[i] + ", "expected a number, tensor or call at column 15, got the end"),
        ("3 = A[i]", "expected an output tensor NAME[...] at column 1"),
        ("C = A[i]", "expected an output tensor NAME[...] at column 1"),
        ("max(A[i]) = A[i]", "expected an output tensor"),
        ("C[i] == A[i]", "expected a number, tensor or call at column 7, got '='"),
        ("C[i] -= A[i]", "expected =, +=, *=, max= or min= at column 6"),
        ("C[i] = A[i*j]", "non-affine index: product of axes at column 11"),
        ("C[i] = A[(i+1)*(j+1)]", "non-affine index: product of axes"),
        ("C[i] = A[B[i]]", "non-affine index: tensor 'B' inside an index at column 10"),
        ("C[i] = A[exp(i)]", "non-affine index: call 'exp' inside an index"),
        ("C[i] = A[i/2]", "non-affine index: division at column 11"),
        ("C[i] = A[0.5]", "index constants must be integers, got '0.5'"),
        ("C[i] = A[]", "expected an index at column 10"),
        ("C[i] = i", "'i' at column 8 is neither a tensor NAME[...] nor a call NAME(...)"),
        ("C[i] = max(A[i])", "max takes 2 argument(s), got 1"),
        ("exp[i] = A[i]", "'exp' is a reserved name, not a tensor"),
        ("C[expr] = A[expr]", "'expr' is a reserved name, not an axis"),
        ("C[i] = " + "(" * (MAX_DEPTH + 5) + "A[i]" + ")" * (MAX_DEPTH + 5), f"nested deeper than {MAX_DEPTH}"),
        ("C[i] = " + "-" * (MAX_DEPTH + 5) + "A[i]", f"nested deeper than {MAX_DEPTH}"),
        ("C[i] = A[i]" + " + A[i]" * MAX_LENGTH, f"longer than {MAX_LENGTH} characters"),
        ("C[i] = A[i]" + "+1" * (MAX_OPERATIONS + 1), f"more than {MAX_OPERATIONS} operations"),
    ],
)
def test_syntax_errors_name_problem_and_column(text, message):
    with pytest.raises(UserError) as err:
        parse_statement(text)
    assert message in str(err.value)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=40), st.text(alphabet="AB ij[](),+-*/=.0123maxexp_", max_size=40)))
def test_any_text_parses_or_is_a_user_error(text):
    try:
        parse_statement(text)
    except UserError as err:
        assert str(err).startswith("expression: ") and "\n" not in str(err)


@pytest.mark.parametrize(
    "text, message",
    [
        # 2^63: TVM raised a TypeError on a BigInt; 2^31 it took as a non-affine int64 index
        ("B[i] += A[i, 9223372036854775808*k]", "index coefficient of k at column 14 is 9223372036854775808, beyond the int32"),
        ("B[i] += A[i, 2147483648*k]", "index coefficient of k at column 14 is 2147483648"),
        ("B[i] += A[i, -2147483648*k + 2147483648]", "index coefficient of k at column 14 is -2147483648"),
        ("B[i] = A[i + 4294967296]", "index constant at column 10 is 4294967296"),
        ("B[i] = A[i] * 1e400", "number 1e400 at column 15 is beyond the range of every float type"),
        ("B[i] = A[i] + " + "9" * 400, "is beyond the range of every float type"),
    ],
)
def test_numbers_beyond_what_tvm_takes_are_refused(text, message):
    with pytest.raises(UserError) as err:
        parse_statement(text)
    assert message in str(err.value)


def test_index_terms_that_cancel_or_fit_are_kept():
    _, _, value = parse_statement("B[i] = A[2147483647*i + 4294967296*j - 4294967296*j, 2147483647]")
    assert [(dict(index.terms), index.const) for index in value.indices] == [({"i": 2147483647}, 0), ({}, 2147483647)]
