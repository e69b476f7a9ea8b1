import pytest
from hypothesis import given
from hypothesis import strategies as st

from workbench.errors import UserError
from workbench.ops.shapes import MAX_ELEMENTS, check_dtype, check_elements, parse_kv


def test_parse_kv_ints_lists_and_booleans():
    assert parse_kv("M=512,N=1024,K=64") == {"M": 512, "N": 1024, "K": 64}
    assert parse_kv("shape=17x11x3,axes=1") == {"shape": (17, 11, 3), "axes": 1}
    assert parse_kv(" trans_a=true , trans_b=False,pad=0") == {"trans_a": True, "trans_b": False, "pad": 0}


@pytest.mark.parametrize(
    "text, message",
    [
        ("M=-3", "--shape: 'M=-3': M must be a positive integer"),
        ("M=abc", "M must be an integer, a list AxBxC or true/false"),
        ("M=2.5", "M must be an integer"),
        ("shape=3x", "shape must be an integer"),
        ("M", "'M' is not of the form NAME=VALUE"),
        ("3=4", "'3=4' is not of the form NAME=VALUE"),
        ("M=1,,N=2", "empty entry"),
        ("M=1,M=2", "M is given twice"),
    ],
)
def test_parse_kv_errors_name_the_entry(text, message):
    with pytest.raises(UserError) as err:
        parse_kv(text)
    assert message in str(err.value)


names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,6}", fullmatch=True)
values = st.one_of(
    st.integers(0, 10**9),
    st.booleans(),
    st.lists(st.integers(0, 10**6), min_size=2, max_size=5).map(tuple),
)


def _format(value) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    return "x".join(map(str, value)) if isinstance(value, tuple) else str(value)


@given(st.dictionaries(names, values, min_size=1, max_size=6))
def test_parse_kv_round_trips(entries):
    text = ",".join(f"{k}={_format(v)}" for k, v in entries.items())
    assert parse_kv(text) == entries


def test_check_elements_limit_is_int32():
    check_elements("A", (MAX_ELEMENTS,))
    with pytest.raises(UserError, match="tensor A has shape 65536x32768"):
        check_elements("A", (65536, 32768))


def test_check_dtype():
    check_dtype("float16")
    with pytest.raises(UserError, match="unsupported dtype 'int7'"):
        check_dtype("int7")


@pytest.mark.parametrize("digits", ["9" * 11, "9" * 5000, "1" + "0" * 4400])
def test_parse_kv_refuses_numbers_too_long_to_convert(digits):
    # Python refuses int() of more than 4300 digits with a ValueError: a traceback before this check.
    with pytest.raises(UserError, match=f"--shape: .*: i is too large \\(at most {MAX_ELEMENTS}\\)"):
        parse_kv(f"i={digits}")
    with pytest.raises(UserError, match="shape is too large"):
        parse_kv(f"shape=4x{digits}")


def test_parse_kv_reads_leading_zeros():
    assert parse_kv("i=" + "0" * 5000 + "7") == {"i": 7}
