"""Labels: a job's string pairs, and the selectors that pick jobs by them.

A job carries at most LABELS_MAX labels (`{"team": "billing"}`); a selector is a
set of pairs that a job must all carry to match (`GET /jobs?label=team:billing`,
`POST /jobs/pause {"labels": {...}}`). Keys and values are short words of a safe
alphabet, so a selector fits a query parameter as `key:value` unescaped and a
label never needs quoting in a JSON path (the SQLite registry's json_extract).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from app.core.errors import FieldError, ValidationError

LABELS_MAX = 16
LABEL_KEY_MAX = 63
LABEL_VALUE_MAX = 63
# A key may carry a prefix (`example.com/team`); it starts with a letter or digit.
LABEL_KEY_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._/-]*$"
LABEL_VALUE_PATTERN = r"^[A-Za-z0-9._-]+$"
SELECTOR_SEPARATOR = ":"

_KEY = re.compile(LABEL_KEY_PATTERN)
_VALUE = re.compile(LABEL_VALUE_PATTERN)

KEY_RULE = (
    f"1 to {LABEL_KEY_MAX} characters: letters, digits, '.', '_', '-', '/', starting with a letter or digit"
)
VALUE_RULE = f"1 to {LABEL_VALUE_MAX} characters: letters, digits, '.', '_', '-'"


def label_key_problem(key: object) -> str | None:
    """Why `key` is not a label key, or None."""
    if not isinstance(key, str) or not 1 <= len(key) <= LABEL_KEY_MAX or not _KEY.match(key):
        return f"a label key is {KEY_RULE}"
    return None


def label_value_problem(value: object) -> str | None:
    """Why `value` is not a label value, or None."""
    if not isinstance(value, str) or not 1 <= len(value) <= LABEL_VALUE_MAX or not _VALUE.match(value):
        return f"a label value is {VALUE_RULE}"
    return None


def parse_labels(value: object, field: str = "labels") -> dict[str, str]:
    """A job's `labels`: an object of at most LABELS_MAX string pairs; None is `{}`.

    Raises ValidationError naming every bad key (`labels.<key>`)."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValidationError.single(field, "must be an object of label keys to string values")
    errors: list[FieldError] = []
    if len(value) > LABELS_MAX:
        errors.append(FieldError(field, f"at most {LABELS_MAX} labels"))
    for key, item in value.items():
        problem = label_key_problem(key) or label_value_problem(item)
        if problem:
            errors.append(FieldError(f"{field}.{key}", problem))
    if errors:
        raise ValidationError(errors)
    return dict(value)


def parse_selector(texts: Iterable[str], field: str = "label") -> dict[str, str]:
    """`key:value` texts (a query's repeated `label`) as the pairs a job must all carry.

    Raises ValidationError on `field` for a text that is not `key:value`, a bad key
    or value, one key asked twice with two values, or more than LABELS_MAX pairs."""
    selector: dict[str, str] = {}
    for text in texts:
        key, sep, value = text.partition(SELECTOR_SEPARATOR)
        shown = repr(text[:80])
        if not sep:
            raise ValidationError.single(field, f"{shown} is not key{SELECTOR_SEPARATOR}value")
        problem = label_key_problem(key) or label_value_problem(value)
        if problem:
            raise ValidationError.single(field, f"{shown}: {problem}")
        if selector.get(key, value) != value:
            raise ValidationError.single(field, f"asks for {key!r} twice with different values")
        selector[key] = value
    if len(selector) > LABELS_MAX:
        raise ValidationError.single(field, f"at most {LABELS_MAX} labels")
    return selector


def parse_selector_object(value: object, field: str = "labels") -> dict[str, str]:
    """A selector given as an object (`{"team": "billing"}`, the body of the label
    verbs): at least one pair, each a valid label."""
    if not isinstance(value, Mapping) or not value:
        raise ValidationError.single(field, "must be an object of at least one label key and value to match")
    return parse_labels(value, field)
