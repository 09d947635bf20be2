"""slca._fields: dataclass fields carrying their own help and checks (TrainConfig's and every estimator options
object's type checker). How TrainConfig uses them: test_config_validation.py."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Annotated, Literal

import pytest

from slca._fields import ConfigError, check_value, coerce, ge, gt, help_of, hints, type_name, within

SCALES = ("group", "batch")


@dataclass
class Opts:
    """Declared as the module docstring says a field is declared."""

    eps: Annotated[float, ge(0)] = field(default=1e-6, metadata={"help": "added to the std"})
    scale: Literal[SCALES] = field(default="group", metadata={"help": "advantage normalisation"})
    n: Annotated[int, within(1, 10)] = 3
    tags: list[str] = field(default_factory=list)
    cap: Annotated[int | None, gt(0)] = None


# ------------------------------------------------------------------ checks


def test_gt_and_ge_say_what_is_wrong():
    assert gt(0)(1) is None and gt(0)(0) == "must be > 0, got 0"
    assert ge(1)(1) is None and ge(1)(0.5) == "must be >= 1, got 0.5"


@pytest.mark.parametrize("check,good,bad,message", [
    (within(0, 1), [0, 0.5, 1], [-0.1, 1.1], "must be in [0, 1]"),
    (within(0, 1, hi_open=True), [0, 0.999], [1], "must be in [0, 1)"),
    (within(0, 1, lo_open=True), [1e-9, 1], [0], "must be in (0, 1]"),
    (within(0, 1, lo_open=True, hi_open=True), [0.5], [0, 1], "must be in (0, 1)"),
])
def test_within_open_and_closed_ends(check, good, bad, message):
    assert all(check(v) is None for v in good)
    for v in bad:
        assert check(v) == f"{message}, got {v!r}"


# ------------------------------------------------------------------ help_of / hints / type_name


def test_help_and_hints_come_from_the_declaration():
    assert [help_of(f) for f in dataclasses.fields(Opts)] == ["added to the std", "advantage normalisation", "", "", ""]
    h = hints(Opts)
    assert h["scale"] == Literal["group", "batch"]
    assert h["eps"].__metadata__[0](-1) == "must be >= 0, got -1"  # the Annotated extras (the checks) are kept


def test_type_name():
    assert [type_name(t) for t in (int, float, str, bool)] == ["int", "float", "str", "bool"]
    assert type_name(int | None) == "int | None"
    assert type_name(list[str]) == "list[str]" and type_name(list[float] | None) == "list[float] | None"


def test_the_dataclass_parses_with_hf_argument_parser_as_it_is():
    """The point of checks in Annotated and help in metadata: transformers' HfArgumentParser takes the class unchanged."""
    transformers = pytest.importorskip("transformers")
    parser = transformers.HfArgumentParser(Opts)
    (opts,) = parser.parse_args_into_dataclasses(["--eps", "0.5", "--scale", "batch", "--n", "4"])
    assert (opts.eps, opts.scale, opts.n) == (0.5, "batch", 4)
    with pytest.raises(SystemExit):  # a Literal field is an argparse choice
        parser.parse_args_into_dataclasses(["--scale", "median"])


# ------------------------------------------------------------------ check_value


@pytest.mark.parametrize("value,hint,want", [
    (3, Annotated[float, ge(0)], (3.0, None)),  # an int for a float comes back a float
    (-1, Annotated[float, ge(0)], (-1.0, "must be >= 0, got -1.0")),
    (True, int, (True, "must be int, got True")),  # a bool is not a number here
    (True, float, (True, "must be float, got True")),
    (1, bool, (1, "must be bool, got 1")),
    ("x", Literal["a", "b"], ("x", "must be one of ['a', 'b'], got 'x'")),
    (True, Literal[1, 2], (True, "must be one of [1, 2], got True")),  # True == 1, but not of its type
    (float("nan"), float, None),
    ([1.0, float("inf")], list[float], None),
    (None, int | None, (None, None)),
    ("3", int | None, ("3", "must be int | None, got '3'")),
    (["a", "b"], list[str], (["a", "b"], None)),
    (["a", 1], list[str], (["a", 1], "must be list[str], got ['a', 1]")),
    (0, Annotated[int | None, gt(0)], (0, "must be > 0, got 0")),
])
def test_check_value(value, hint, want):
    got = check_value(value, hint)
    if want is None:  # a non-finite number (NaN != NaN: compare the message)
        assert got[1] == f"must be a finite number, got {value!r}"
    else:
        assert got == want
        assert type(got[0]) is type(want[0])


# ------------------------------------------------------------------ coerce


@pytest.mark.parametrize("raw,hint,want", [
    ("3", int, 3),
    ("3", float, 3.0),
    ("1e-3", Annotated[float, gt(0)], 1e-3),
    ("text", str, "text"),
    ("a, b,,c ", list[str], ["a", "b", "c"]),
    ("1,2", list[int], [1, 2]),
    ("none", int | None, None),
    ("NULL", float | None, None),
    ("", int | None, None),
    ("4", Annotated[int | None, ge(0)], 4),
    ("yes", bool, True),
    ("TRUE", bool, True),
    ("0", bool, False),
    ("false", bool, False),
    ("5", int | str, "5"),  # a union of several types: left as given, for check_value to judge
])
def test_coerce_reads_a_string_as_the_annotated_type(raw, hint, want):
    got = coerce(raw, hint)
    assert got == want and type(got) is type(want)


@pytest.mark.parametrize("raw,hint,message", [
    ("x", int, "must be an integer, got 'x'"),
    ("1.5", int, "must be an integer, got '1.5'"),
    ("x", float, "must be a number, got 'x'"),
    ("maybe", bool, "must be a boolean (true/false), got 'maybe'"),
    ("1,x", list[int], "must be an integer, got 'x'"),
])
def test_coerce_refuses_saying_what_was_expected(raw, hint, message):
    with pytest.raises(ValueError) as e:
        coerce(raw, hint)
    assert str(e.value) == message


def test_config_error_names_the_field():
    e = ConfigError("lr", "must be > 0, got 0")
    assert isinstance(e, ValueError) and e.field == "lr" and str(e) == "lr: must be > 0, got 0"
