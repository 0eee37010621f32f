"""The newcomer's path: the README's two commands are the ones the Makefile and CI run."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def readme_commands() -> dict[str, str]:
    """The commands of the README's "Two commands" block: {"demo": "make demo", "test": "make test"}."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = re.search(r"^## Two commands\n(.*?)(?=^## )", text, re.MULTILINE | re.DOTALL)
    assert section, "README.md lost its '## Two commands' section"
    block = re.search(r"```sh\n(.*?)```", section.group(1), re.DOTALL)
    commands = {}
    for line in block.group(1).splitlines():
        command = line.split("#")[0].strip()
        if command:
            commands[command.split()[-1]] = command
    return commands


def makefile_recipe(target: str) -> list[str]:
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    match = re.search(rf"^{target}:.*\n((?:\t.*\n?)+)", text, re.MULTILINE)
    assert match, f"the Makefile has no {target!r} target"
    return [line.strip() for line in match.group(1).splitlines()]


def test_the_readme_test_command_is_the_one_ci_runs():
    commands = readme_commands()
    assert commands.get("test") == "make test"
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    ci_commands = [line.strip() for line in ci.splitlines() if line.strip() and not line.strip().startswith("#")]
    assert commands["test"] in ci_commands, ".ci/run must run the README's test command as is"


def test_make_test_sets_up_the_machine_then_runs_pytest():
    recipe = makefile_recipe("test")
    assert recipe[0].startswith("scripts/bootstrap.sh --test")
    assert any("pytest" in line for line in recipe[1:])


def test_the_readme_demo_command_runs_skiplock_demo_after_set_up():
    assert readme_commands().get("demo") == "make demo"
    recipe = makefile_recipe("demo")
    assert recipe[0].startswith("scripts/bootstrap.sh")
    assert any(re.search(r"skiplock demo\b", line) for line in recipe[1:])


def test_the_procfile_has_web_scheduler_and_worker():
    entries = dict(
        line.split(":", 1) for line in (ROOT / "Procfile").read_text().splitlines() if line.strip() and not line.startswith("#")
    )
    assert {"web", "scheduler", "worker"} <= set(entries)
    assert "gunicorn" in entries["web"] and "--no-control-socket" in entries["web"]
    assert "skiplock scheduler" in entries["scheduler"]
    assert "skiplock worker" in entries["worker"]


@pytest.mark.parametrize("page", ["README.md", "docs/operators-guide.md", "docs/architecture.md"])
def test_the_newcomers_pages_link_to_files_that_exist(page):
    path = ROOT / page
    text = path.read_text(encoding="utf-8")
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        if "://" in target:
            continue
        assert (path.parent / target).exists(), f"{page} links to {target}, which does not exist"
