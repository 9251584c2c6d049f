"""The monitoring files of ``deploy/``: the Prometheus alert rules and the Grafana dashboard.

Every metric either names, and every label it groups or matches by (with every exact label
value), is one the service exports: read from ``/metrics`` of the real app after one usage
report. The rules have what an alert needs (a duration, a severity, words for the person paged);
the dashboard's panels each have a query and do not overlap. With ``promtool`` installed, the
rules are checked and their unit tests (``alerts.test.yaml``: the alert fires on a falling hit
ratio, only with enough traffic) run, and every dashboard query parses as PromQL.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from context_assembly.api.app import create_app
from context_assembly.config import load_settings

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "alerts.yaml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "alerts.test.yaml"
DASHBOARD = ROOT / "deploy" / "grafana" / "context-assembly.json"

METRIC = re.compile(r"\b(?:context_assembly|python)_[a-z0-9_]+")
# A selector's braces, an aggregation's ``by (...)`` / ``without (...)`` and a matcher in them.
SELECTOR = re.compile(r"(\b(?:context_assembly|python)_[a-z0-9_]+)\{([^}]*)\}")
GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
MATCHER = re.compile(r'(\w+)\s*(=~|!~|!=|=)\s*"([^"]*)"')
# Grafana's variables, as a query's PromQL gets them (for promtool).
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__range": "1d", "$tenant": ".*"}

Exported = dict[str, list[dict[str, str]]]


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Exported]:
    """Each sample name on ``/metrics`` of the real app, with its label sets, after a priced
    usage report (the usage series of a tenant appear with its first report)."""
    path = tmp_path_factory.mktemp("metrics") / "store.db"
    app = create_app(load_settings(store={"path": str(path)}))
    with TestClient(app) as client:
        body = {"model": "claude-sonnet-4-5", "input": [{"role": "user", "content": "hi"}]}
        prep = client.post("/v1/prepare", json=body)
        assert prep.status_code == 200, prep.text
        usage = {"input_tokens": 10, "cache_read_input_tokens": 90, "output_tokens": 5}
        report = {"report_id": "r", "provider": "anthropic", "usage": usage}
        answer = client.post(f"/v1/preparations/{prep.json()['preparation_id']}/usage", json=report)
        assert answer.status_code == 200, answer.text
        text = client.get("/metrics").text
    found: Exported = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, []).append(dict(sample.labels))
    yield found


def _rules() -> list[dict[str, Any]]:
    document = yaml.safe_load(RULES.read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


def _dashboard() -> dict[str, Any]:
    dashboard: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return dashboard


def _dashboard_queries() -> list[str]:
    """Every PromQL query of the dashboard: the panels' targets and the variables' queries."""
    queries = [t["expr"] for panel in _dashboard()["panels"] for t in panel["targets"]]
    for variable in _dashboard()["templating"]["list"]:
        if variable["type"] == "query":
            queries.append(variable["query"]["query"])
    return queries


def _every_query() -> list[tuple[str, str]]:
    """``(where, PromQL)`` of the rules and the dashboard."""
    return [(f"alert {rule['alert']}", rule["expr"]) for rule in _rules()] + [
        ("dashboard", query) for query in _dashboard_queries()
    ]


def test_the_monitoring_files_name_only_exported_metrics(exported: Exported) -> None:
    """Each metric named in a query, an annotation or a panel's words is on ``/metrics``."""
    texts = [RULES.read_text(), DASHBOARD.read_text()]
    named = {name for text in texts for name in METRIC.findall(text)}
    assert "context_assembly_usage_cost_usd_total" in named  # the search finds them at all
    missing = sorted(name for name in named if name not in exported)
    assert not missing, f"not exported by the service: {missing}"
    for where, query in _every_query():
        assert METRIC.search(query), f"{where}: {query} names no metric of the service"


def test_the_monitoring_queries_use_only_exported_labels_and_values(exported: Exported) -> None:
    """Every label a query groups by is a label of each metric it names; every label it
    matches on is one of the metric's, and an exact value is one the service writes."""
    for where, query in _every_query():
        names = set(METRIC.findall(query))
        labelled = {name: set().union(*map(set, exported.get(name, []))) for name in names}
        for grouping in GROUPING.findall(query):
            for label in filter(None, (part.strip() for part in grouping.split(","))):
                for name in names:
                    assert label in labelled[name], f"{where}: {name} has no label {label!r}"
        for name, matchers in SELECTOR.findall(query):
            for label, operator, value in MATCHER.findall(matchers):
                assert label in labelled[name], f"{where}: {name} has no label {label!r}"
                if operator == "=":
                    values = {labels.get(label) for labels in exported.get(name, [])}
                    assert value in values, f"{where}: {name} never has {label}={value!r}"


def test_the_alert_rules_say_what_fired_and_how_badly() -> None:
    """Each rule is an alert with a duration, a severity, a summary and a description; the
    falling hit ratio is among them, on the cached and the total input tokens."""
    rules = _rules()
    assert rules
    for rule in rules:
        assert set(rule) == {"alert", "expr", "for", "labels", "annotations"}, rule.get("alert")
        assert re.fullmatch(r"\d+[smh]", rule["for"])
        assert rule["labels"]["severity"] in {"warning", "critical"}
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]
    falling = next(r for r in rules if r["alert"] == "ContextAssemblyCacheHitRatioFalling")
    assert "context_assembly_usage_cached_input_tokens_total" in falling["expr"]
    assert "context_assembly_usage_input_tokens_total" in falling["expr"]


def test_the_dashboard_panels_each_query_and_fit_the_grid() -> None:
    """Unique panel ids, each panel with at least one query on the datasource variable, the
    panels within Grafana's 24 columns and none covering another; the tenant variable reads
    the tenants from a usage series."""
    dashboard = _dashboard()
    panels = dashboard["panels"]
    assert dashboard["uid"] and dashboard["title"]
    assert len({p["id"] for p in panels}) == len(panels)
    cells: set[tuple[int, int]] = set()
    for panel in panels:
        assert panel["targets"], panel["title"]
        assert all(t["datasource"]["uid"] == "${datasource}" for t in panel["targets"])
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        mine = {
            (x, y)
            for x in range(grid["x"], grid["x"] + grid["w"])
            for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert not cells & mine, f"{panel['title']} covers another panel"
        cells |= mine
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["query"] == "prometheus"
    assert "context_assembly_usage_reports_total" in variables["tenant"]["query"]["query"]
    titles = " ".join(p["title"] for p in panels).lower()
    for shown in ("by bucket", "hit ratio", "by miss cause"):
        assert shown in titles


def _promtool() -> str:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed: the rules are checked as YAML only")
    return promtool


def _run(*command: str, cwd: Path) -> None:
    done = subprocess.run(
        command, cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_promtool_checks_the_rules_and_runs_their_unit_tests() -> None:
    """``promtool check rules`` accepts the file, and ``promtool test rules`` passes: the alert
    fires for a tenant whose hit ratio fell, not before its 30 minutes, not for a tenant with
    too few tokens."""
    promtool = _promtool()
    _run(promtool, "check", "rules", str(RULES), cwd=RULES.parent)
    _run(promtool, "test", "rules", str(RULE_TESTS), cwd=RULES.parent)


def test_promtool_parses_every_dashboard_query(tmp_path: Path) -> None:
    """Each dashboard query, with Grafana's variables given values, parses as PromQL (checked
    as a recording rule by ``promtool check rules``)."""
    promtool = _promtool()
    rules = []
    for index, query in enumerate(_dashboard_queries()):
        if query.startswith("label_values("):
            continue  # Grafana's own function, not PromQL
        for variable, value in GRAFANA_VARIABLES.items():
            query = query.replace(variable, value)
        rules.append({"record": f"dashboard:query_{index}", "expr": query})
    path = tmp_path / "dashboard-rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    _run(promtool, "check", "rules", str(path), cwd=tmp_path)
