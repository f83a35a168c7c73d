"""docs/grafana-dashboard.json queries only metrics sbx emits: every metric name in its
PromQL (the panels' `expr`, the variables' `label_values`) is a series that the real
`sbx metrics --all --format prometheus` or the real service's /metrics produced here."""

from __future__ import annotations

import json
import re

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support import ROOT, write_profile

from tests.service.live import LiveService

DASHBOARD = ROOT / "docs" / "grafana-dashboard.json"
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset",
            "and", "or", "unless", "inf", "nan"}
CONTAINER_FAMILIES = {"container_cpu_usage", "container_memory_usage_bytes",
                      "container_network_io_bytes_total", "container_uptime_seconds",
                      "sbx_sandbox_memory_limit_bytes", "sbx_sandbox_pids"}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (not its functions, labels or keywords)."""
    expr = re.sub(r'"(?:\\.|[^"\\])*"', '""', expr)
    expr = re.sub(r"\{[^}]*\}", "", expr)
    expr = re.sub(r"\[[^\]]*\]", "", expr)
    expr = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
    expr = re.sub(r"\$\{?\w+\}?", "", expr)
    names = set()
    for match in re.finditer(r"(?<![\w.])[A-Za-z_:][A-Za-z0-9_:]*", expr):
        if expr[match.end():].lstrip().startswith("(") or match.group().lower() in KEYWORDS:
            continue
        names.add(match.group())
    return names


def queried(dashboard: dict) -> dict[str, set[str]]:
    """Each query of the dashboard and the metric names it uses."""
    found: dict[str, set[str]] = {}
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            found[target["expr"]] = metric_names(target["expr"])
    for variable in dashboard["templating"]["list"]:
        query = variable.get("query", "")
        if variable["type"] == "query":
            (inner,) = re.findall(r"label_values\((.*),\s*\w+\)$", query)
            found[query] = metric_names(inner)
    return found


def emitted(text: str) -> set[str]:
    """The series names a Prometheus text exposition carries, by its families' types."""
    names = set()
    for family in text_string_to_metric_families(text):
        suffixes = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_count", "_sum",
                                                                    "_created"),
                    "summary": ("_count", "_sum", "_created")}.get(family.type, ("",))
        names |= {family.name + suffix for suffix in suffixes}
        names |= {sample.name for sample in family.samples}
    return names


def unknown(dashboard: dict, names: set[str]) -> dict[str, set[str]]:
    return {q: used - names for q, used in queried(dashboard).items() if used - names}


@pytest.mark.docker
def test_every_metric_the_dashboard_queries_is_one_sbx_emits(sbx, tmp_path):
    """The names come from the real outputs: a docker sandbox (on a network of its own, so
    it has network figures) read by `sbx metrics --all --format prometheus`, and the
    service's /metrics over the same installation."""
    networked = write_profile(tmp_path, "networked", "extends: default\nnetwork: {mode: full}\n")
    box = sbx.create("--profile-file", str(networked))
    shot = sbx("metrics", "--all", "--format", "prometheus")
    assert shot.code == 0, shot.err
    from_cli = emitted(shot.out)
    assert CONTAINER_FAMILIES <= from_cli  # with the sandbox's own series

    service = LiveService(sbx.home).start()
    try:
        text = httpx.get(f"{service.url}/metrics", timeout=60, headers={
            "Authorization": f"Bearer {service.key('admin')}"}).text  # an operator's
    finally:
        service.stop()
    from_service = emitted(text)
    assert CONTAINER_FAMILIES <= from_service  # the same families on the service
    assert f'sbx_sandbox_id="{box["id"]}"' in text
    dashboard = json.loads(DASHBOARD.read_text())
    assert unknown(dashboard, from_cli | from_service) == {}
    used = set().union(*queried(dashboard).values())
    assert CONTAINER_FAMILIES <= used  # and it shows every container family
    assert {"sbx_sandboxes", "sbx_operation_duration_seconds_bucket", "sbx_reaper_runs_total",
            "sbx_reaped_sandboxes_total", "sbx_event_deliveries_total"} <= used
    assert sbx("destroy", box["id"]).code == 0


def test_the_check_names_a_query_of_a_metric_sbx_does_not_emit():
    dashboard = json.loads(DASHBOARD.read_text())
    wrong = ('sum by (sink) (rate(sbx_event_deliveries_total[5m])) / '
             'on(sink) container_cpu_usage_seconds_total{sbx_backend="docker"}')
    dashboard["panels"][-1]["targets"][0]["expr"] = wrong
    names = {"sbx_event_deliveries_total", "container_cpu_usage"}
    assert unknown(dashboard, names)[wrong] == {"container_cpu_usage_seconds_total"}


def test_metric_names_leave_out_functions_labels_and_variables():
    assert metric_names('histogram_quantile(0.95, sum by (le, kind) (rate('
                        'sbx_operation_duration_seconds_bucket{backend=~"$backend"}'
                        '[$__rate_interval])))') == {"sbx_operation_duration_seconds_bucket"}
    assert metric_names('a_bytes{x="y"} / on(sbx_sandbox_id) b_bytes') == {"a_bytes", "b_bytes"}
