"""Every setting has a default of its type and help text, the example file lists each one and
loads, and a bad value stops a real command at start-up with a message naming the setting."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from console.cli.settings import example_toml
from console.config import SETTINGS, ConfigError, load_config

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "docs" / "skiplock.example.toml"
REGENERATE = "regenerate it: .venv/bin/skiplock config example > docs/skiplock.example.toml"


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: s.dotted)
def test_every_setting_has_a_typed_default_and_help(setting):
    if setting.type in (int, float, str, bool):
        assert isinstance(setting.default, setting.type) and not (setting.type is int and isinstance(setting.default, bool))
    else:  # a parser such as config.duration: the default must be what it returns for itself
        assert setting.type(setting.default) == setting.default, f"{setting.dotted}: default does not parse"
    assert len(setting.help.strip()) >= 10, f"{setting.dotted} needs help text"
    if setting.check is not None:
        assert setting.check(setting.default) is None, f"{setting.dotted}: its default fails its own check"


@pytest.mark.parametrize("setting", [s for s in SETTINGS if s.type is not str], ids=lambda s: s.dotted)
def test_a_bad_value_names_the_setting(setting):
    with pytest.raises(ConfigError) as info:
        load_config(env={setting.env_var: "not-a-value"})
    assert setting.dotted in str(info.value) and setting.env_var in str(info.value)


def test_the_example_file_has_every_setting_at_its_default_and_loads():
    data = tomllib.loads(EXAMPLE.read_text(encoding="utf-8"))
    missing = [s.dotted for s in SETTINGS if s.key not in data.get(s.section, {})]
    assert not missing, f"docs/skiplock.example.toml lacks {missing}; {REGENERATE}"
    config = load_config(EXAMPLE, env={})
    stale = [s.dotted for s in SETTINGS if config.get(s.section, s.key) != s.default]
    assert not stale, f"docs/skiplock.example.toml has old defaults for {stale}; {REGENERATE}"
    for setting in SETTINGS:
        assert config.get(setting.section, setting.key) == setting.default


def test_the_generated_example_loads():
    path = ROOT / "docs" / "skiplock.example.toml"
    assert tomllib.loads(example_toml())  # valid TOML even when sections are declared apart
    assert load_config(path, env={})


def test_a_bad_value_stops_a_command_before_it_starts(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SKIPLOCK_")}
    env.update(SKIPLOCK_WORKER_LEASE="soon", DATABASE_URL="postgresql://nobody@127.0.0.1:1/none",
               PYTHONPATH=str(ROOT))
    result = subprocess.run([sys.executable, "-m", "console", "worker", "--tasks", "console.demo.tasks"],
                            env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "worker.lease" in result.stderr and "SKIPLOCK_WORKER_LEASE" in result.stderr
    assert "Traceback" not in result.stderr
    bad_file = tmp_path / "skiplock.toml"
    bad_file.write_text("[worker]\nconcurency = 3\n")
    result = subprocess.run([sys.executable, "-m", "console", "--config", str(bad_file), "config", "show"],
                            env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "worker.concurency" in result.stderr
