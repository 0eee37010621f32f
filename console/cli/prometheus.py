"""`skiplock prometheus rules|dashboard`: the Prometheus alerting rules and the Grafana dashboard,
generated from the metric catalog and the default alert rules (console/prometheus.py).

docs/prometheus/ holds their output; regenerate it after changing the catalog or a default rule.
Neither command reads the database or the config file.
"""

from __future__ import annotations

import click

from console.alerts.model import link_problem
from console.cli.common import main_group
from console.prometheus import dashboard_json, rules_yaml


@main_group.group("prometheus")
def prometheus_group() -> None:
    """Files for your own Prometheus and Grafana (docs/metrics.md)."""


@prometheus_group.command("rules")
@click.option("--runbook-base-url", default="", metavar="URL",
              help="Join each relative runbook path (docs/alerts.md#...) to this URL in runbook_url.")
def rules_cmd(runbook_base_url: str) -> None:
    """Print the default alert rules as a Prometheus rules file (> docs/prometheus/skiplock-rules.yml)."""
    if runbook_base_url and (problem := link_problem(runbook_base_url)):
        raise click.BadParameter(problem, param_hint="--runbook-base-url")
    click.echo(rules_yaml(runbook_base_url=runbook_base_url), nl=False)


@prometheus_group.command("dashboard")
def dashboard_cmd() -> None:
    """Print the Grafana dashboard JSON (> docs/prometheus/skiplock-dashboard.json)."""
    click.echo(dashboard_json(), nl=False)
