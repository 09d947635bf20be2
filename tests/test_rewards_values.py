"""Value normalisation and extraction (slca.rewards.values): numbers, strings and containers made comparable,
the values and entities a free text states, and the words an object supports."""

from __future__ import annotations

import pytest

from slca.rewards.values import (
    canon_number,
    contains_phrase,
    entity_supported,
    extract_entities,
    extract_values,
    leaf_tokens,
    leaf_values,
    normalize,
    normalized_call_key,
    tokens,
)
from slca.types import ToolCall, call_key

from _helpers import values_equal


def test_values_helpers():
    assert values_equal("182", 182.0) and values_equal(" Paris ", "paris") and not values_equal("1,5", 15)
    assert normalize({"a": ["2", "X"]}) == {"a": [2.0, "x"]}
    v = extract_values("On 2025-07-03 FL482 costs 1,250 USD; sunrise 6:05, score 2-1, UTC -3 and 167.40.")
    assert v == {"date:2025-07-03", "id:fl482", "num:1250", "time:06:05", "score:2-1", "num:-3", "num:167.4"}


@pytest.mark.parametrize("text,entities", [
    ("In Berlin on 2025-03-14 it is 14 C and sunny.", {"berlin", "c"}),
    ("50 USD is 58.23 EUR.", {"usd", "eur"}),
    ("Golden Fork (R123) is a italian restaurant in Paris.", {"fork", "paris"}),  # "Golden" opens the sentence
    ("I booked a table at Golden Fork; reservation T123 is confirmed.", {"golden fork"}),
    ("Hello Anna! How can I help you today?", {"anna"}),
    ("Sorry, I cannot book a taxi with the available tools.", set()),
    ("Booked TP1203 (212.5 EUR); booking BK-7781 is confirmed.", {"eur"}),  # ids are values, not entities
    ("The AQI is 57 in New York; Paris is at UTC +1.", {"aqi", "new york", "paris", "utc"}),
])
def test_extract_entities(text, entities):
    assert extract_entities(text) == {"ent:" + e for e in entities}


def test_entity_support_is_word_by_word_case_insensitive():
    ev = leaf_tokens({"name": "Golden Fork", "temp_c": 14}, keys=True)
    assert entity_supported("ent:golden fork", ev) and entity_supported("ent:c", ev)
    assert not entity_supported("ent:blue fork", ev) and not entity_supported("ent:f", ev)


@pytest.mark.parametrize("x,text", [(182.0, "182"), (182, "182"), (167.440, "167.44"), (-3.0, "-3"), (1 / 3, "0.333333"),
                                    (2.0000001, "2")])
def test_canon_number(x, text):
    assert canon_number(x) == text


def test_normalize_keeps_booleans_and_reads_only_well_formed_thousands():
    assert normalize(True) is True and normalize(None) is None  # not the number 1
    assert normalize("1,250") == 1250.0 and normalize("-3.5") == -3.5 and normalize("1e3") == 1000.0
    assert normalize("1,5") == "1,5" and normalize("12,34") == "12,34"  # not a thousands separator: text
    assert normalize("  New \t York ") == "new york"
    assert normalize((1, "A")) == [1.0, "a"] and normalize({1: "B"}) == {"1": "b"}
    assert normalize(0.1 + 0.2) == normalize(0.3)  # rounded to 6 decimals


def test_normalized_call_key_agrees_on_normalised_arguments():
    a = ToolCall("get_weather", {"city": "  PARIS ", "days": "2"})
    b = ToolCall("get_weather", {"days": 2, "city": "paris"})
    assert normalized_call_key(a) == normalized_call_key(b) and a.key() != b.key()
    assert normalized_call_key(a) != normalized_call_key(ToolCall("get_time", b.arguments))
    assert normalized_call_key(b) == call_key("get_weather", {"city": "paris", "days": 2.0})


def test_extract_values_masks_dates_and_ids_before_numbers():
    assert extract_values("It costs 12. Then -3.5 more.") == {"num:12", "num:-3.5"}
    assert extract_values("Due 2025-07-03.") == {"date:2025-07-03"}  # not also 2025, 07, 03 or a score 07-03
    assert extract_values("Flight fl482 leaves at 9:05:30.") == {"id:fl482", "time:09:05"}
    assert extract_values("No numbers here.") == set()


def test_leaf_values_reads_numbers_and_strings_not_booleans():
    values, words = leaf_values({"temp": 14, "note": ["FL482 at 06:05", True, None], "ok": False})
    assert values == {"num:14", "id:fl482", "time:06:05"}
    assert {"fl482 at 06:05", "fl", "at"} <= words and "true" not in words
    assert leaf_values(3.0)[0] == {"num:3"}


def test_tokens_and_leaf_tokens():
    assert tokens("temp_c: 14") == ["temp", "c", "14"]
    assert tokens("Golden Fork, São Paulo") == ["golden", "fork", "são", "paulo"]
    obj = {"temp_c": "Sunny day", "list": ["Rome", 3]}
    assert leaf_tokens(obj) == {"sunny", "day", "rome"}
    assert leaf_tokens(obj, keys=True) == {"sunny", "day", "rome", "temp", "c", "list"}


@pytest.mark.parametrize("text,phrase,found", [
    ("I booked the Golden Fork tonight.", "golden fork", True),
    ("I booked the Golden Fork tonight.", "fork golden", False),  # in order
    ("I booked the Golden Fork tonight.", "gold", False),  # whole words
    ("Add a piano-lesson at 5.", "piano lesson", True),  # punctuation between words does not matter
    ("anything", "", False),
])
def test_contains_phrase(text, phrase, found):
    assert contains_phrase(text, phrase) is found
