"""Retention's policy: what PUNCTUAL_HISTORY_DAYS accepts and which instant it cuts at."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from app.core.errors import SettingsError
from app.pollers.retention import history_cutoff
from app.settings import Settings

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def test_history_is_kept_thirty_days_by_default():
    assert Settings.from_env({}).history_days == 30
    assert history_cutoff(NOW, 30) == NOW - timedelta(days=30)


@pytest.mark.parametrize("raw, days", [("0.5", 0.5), ("1", 1.0), ("365", 365.0), ("0.001", 0.001)])
def test_fractions_of_a_day_are_allowed(raw, days):
    assert Settings.from_env({"PUNCTUAL_HISTORY_DAYS": raw}).history_days == days
    assert history_cutoff(NOW, days) == NOW - timedelta(seconds=days * 86400)


@pytest.mark.parametrize("raw", ["0", "-1", "nan", "inf", "thirty", "1e400"])
def test_a_bad_number_of_days_is_one_line_naming_the_variable(raw):
    with pytest.raises(SettingsError) as caught:
        Settings.from_env({"PUNCTUAL_HISTORY_DAYS": raw})
    message = str(caught.value)
    assert message.startswith(f"PUNCTUAL_HISTORY_DAYS={raw!r}") and "\n" not in message
