"""The scenario suite covers the alert catalog: every rule Skiplock ships has at least one
scenario that injects its condition (tests/scenarios.py COVERED), every named scenario exists,
and every rule is scaled for the suite. A new rule without a scenario fails here."""

from __future__ import annotations

import ast
from pathlib import Path

from console.alerts.defaults import DEFAULT_NAMES
from tests.scenarios import COVERED, QUIET, SCALED

TESTS = Path(__file__).resolve().parent


def _defined(node_id: str) -> bool:
    file, _, name = node_id.partition("::")
    tree = ast.parse((TESTS / file).read_text(encoding="utf-8"))
    return any(isinstance(n, ast.FunctionDef) and n.name == name for n in tree.body)


def test_every_rule_of_the_catalog_has_a_scenario():
    missing = [name for name in DEFAULT_NAMES if not COVERED.get(name)]
    assert not missing, f"add a scenario (tests/test_scenarios_*.py) for rule(s) {missing} and list it in COVERED"
    assert set(COVERED) == set(DEFAULT_NAMES), f"COVERED names rules that do not exist: {set(COVERED) - set(DEFAULT_NAMES)}"
    assert set(SCALED) == set(DEFAULT_NAMES), f"scale every rule for the suite (SCALED): {set(DEFAULT_NAMES) ^ set(SCALED)}"


def test_every_listed_scenario_exists_and_is_marked():
    listed = [node for nodes in COVERED.values() for node in nodes] + list(QUIET)
    absent = [node for node in listed if not _defined(node)]
    assert not absent, f"COVERED/QUIET list scenarios that are not defined: {absent}"
    for file in {node.partition("::")[0] for node in listed}:
        text = (TESTS / file).read_text(encoding="utf-8")
        assert "pytest.mark.scenario" in text, f"{file}: mark the scenarios with pytest.mark.scenario"
