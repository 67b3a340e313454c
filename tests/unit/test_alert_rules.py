"""deploy/prometheus/alerts.yml: the alert rules shipped for operators.

Every metric a rule names must be one Punctual serves (app/metrics.py: the counters
and histograms every process shares, and the API's registry gauges), or the rule
would silently never fire. promtool (from Debian's `prometheus` package, which
scripts/test puts in the venv where it runs as root) checks the file's syntax and runs the
rules' own unit tests, alerts.test.yml: each alert fires on the series meant to
raise it.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from prometheus_client.metrics import MetricWrapperBase

import app.metrics

RULES_DIR = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"
RULES = RULES_DIR / "alerts.yml"
# The sample names each metric type exposes (prometheus-client's text format).
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}


def served_names() -> set[str]:
    names = set(app.metrics.REGISTRY_GAUGES)
    for value in vars(app.metrics).values():
        if isinstance(value, MetricWrapperBase):
            names |= {value._name + suffix for suffix in SUFFIXES[value._type]}
    return names


def rules() -> list[dict]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def test_every_metric_a_rule_names_is_served():
    served = served_names()
    assert {"punctual_polls_total", "punctual_backlog_age_seconds", "punctual_claims_total"} <= served
    named = set()
    for rule in rules():
        named |= set(re.findall(r"\bpunctual_[a-z_]+\b", rule["expr"]))
    assert named, "no metric found in the rules: the pattern is broken"
    assert named <= served, f"rules name metrics Punctual does not serve: {sorted(named - served)}"


def test_the_rules_cover_what_an_operator_is_paged_for():
    exprs = {rule["alert"]: rule["expr"] for rule in rules()}
    wanted = {
        "PunctualBacklogOld": "punctual_backlog_age_seconds",
        "PunctualShardNotPolled": "punctual_polls_total",
        "PunctualLatenessHigh": "punctual_start_lateness_seconds_bucket",
        "PunctualLeasesExpiring": "punctual_leases_expired_total",
        "PunctualDeadLetters": "punctual_dead_letters_total",
    }
    for alert, metric in wanted.items():
        assert metric in exprs[alert], alert
    for rule in rules():
        assert rule["labels"]["severity"] in ("info", "warning", "critical"), rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], rule["alert"]


# scripts/test puts promtool in the venv; one on PATH does as well.
PROMTOOL = shutil.which("promtool", path=str(Path(sys.executable).parent)) or shutil.which("promtool")
promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed here")


@promtool
def test_promtool_checks_the_rules():
    assert PROMTOOL is not None
    result = subprocess.run([PROMTOOL, "check", "rules", str(RULES)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


@promtool
def test_each_alert_fires_on_the_series_meant_to_raise_it():
    assert PROMTOOL is not None
    result = subprocess.run(
        [PROMTOOL, "test", "rules", "alerts.test.yml"], cwd=RULES_DIR, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
    tested = set(re.findall(r"alertname: (\w+)", (RULES_DIR / "alerts.test.yml").read_text()))
    assert tested == {rule["alert"] for rule in rules()}, "an alert without a promtool test"
