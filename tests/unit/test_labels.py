"""Labels and selectors (app.core.labels): what a key and a value may be, and how a
selector reads."""

from __future__ import annotations

import pytest

from app.core.errors import ValidationError
from app.core.labels import LABELS_MAX, parse_labels, parse_selector, parse_selector_object


@pytest.mark.parametrize(
    "labels",
    [{}, {"team": "billing"}, {"example.com/team": "a.b_c-d"}, {"0k": "9"}, {"k" * 63: "v" * 63}],
)
def test_valid_labels_are_kept(labels):
    assert parse_labels(labels) == labels


def test_null_labels_are_none():
    assert parse_labels(None) == {}


@pytest.mark.parametrize(
    "key, value",
    [
        ("-team", "x"),
        (".team", "x"),
        ("te am", "x"),
        ("team:x", "x"),
        ("", "x"),
        ("k" * 64, "x"),
        ("team", ""),
        ("team", "a b"),
        ("team", "a/b"),
        ("team", "v" * 64),
        ("team", 1),
        ("team", None),
        ("tëam", "x"),
    ],
)
def test_a_bad_key_or_value_is_named_by_its_path(key, value):
    with pytest.raises(ValidationError) as caught:
        parse_labels({"ok": "fine", key: value})
    assert [error.field for error in caught.value.errors] == [f"labels.{key}"]


def test_more_than_the_most_labels_is_refused_and_each_bad_pair_named_too():
    labels = {f"k{i}": "v" for i in range(LABELS_MAX)} | {"bad key": "v"}
    with pytest.raises(ValidationError) as caught:
        parse_labels(labels)
    assert [error.field for error in caught.value.errors] == ["labels", "labels.bad key"]


def test_labels_must_be_an_object():
    with pytest.raises(ValidationError):
        parse_labels(["team", "billing"])


def test_a_selector_reads_key_value_texts():
    assert parse_selector(["team:billing", "env:prod", "team:billing"]) == {"team": "billing", "env": "prod"}
    assert parse_selector([]) == {}


@pytest.mark.parametrize("text", ["team", ":billing", "team:", "team:bill ing", "te am:x", "team:a:b"])
def test_a_bad_selector_is_refused_on_its_parameter(text):
    with pytest.raises(ValidationError) as caught:
        parse_selector([text])
    assert [error.field for error in caught.value.errors] == ["label"]


def test_a_selector_asking_one_key_twice_with_two_values_is_refused():
    with pytest.raises(ValidationError, match="twice"):
        parse_selector(["team:a", "team:b"])


def test_a_selector_object_needs_at_least_one_pair():
    assert parse_selector_object({"team": "billing"}) == {"team": "billing"}
    for empty in ({}, None, []):
        with pytest.raises(ValidationError):
            parse_selector_object(empty)
