"""Configuration: defaults, the TOML file, the environment (which wins), and loud failures."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from console.config import RECORD_TABLES, SETTINGS, ConfigError, load_config

DOC = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"


def write(tmp_path, text: str):
    path = tmp_path / "skiplock.toml"
    path.write_text(text)
    return path


def test_defaults_apply_without_a_file_or_environment():
    config = load_config(env={})
    for setting in SETTINGS:
        assert config.get(setting.section, setting.key) == setting.default


def test_the_file_sets_values_and_the_environment_wins(tmp_path):
    path = write(tmp_path, "[worker]\nconcurrency = 12\nlease = 30\n[queue]\nmax_attempts = 9\n")
    config = load_config(path, env={"SKIPLOCK_WORKER_LEASE": "7.5"})
    assert config.worker.concurrency == 12
    assert config.worker.lease == 7.5  # environment over file
    assert config.queue.max_attempts == 9
    assert config.worker.batch_size == 10  # untouched default


def test_the_config_file_can_come_from_skiplock_config(tmp_path):
    path = write(tmp_path, "[worker]\nbatch_size = 25\n")
    assert load_config(env={"SKIPLOCK_CONFIG": str(path)}).worker.batch_size == 25


@pytest.mark.parametrize("env, named", [
    ({"SKIPLOCK_WORKER_CONCURRENCY": "many"}, "worker.concurrency (from $SKIPLOCK_WORKER_CONCURRENCY): 'many' is not a valid int"),
    ({"SKIPLOCK_WORKER_CONCURRENCY": "0"}, "worker.concurrency (from $SKIPLOCK_WORKER_CONCURRENCY): '0' must be greater than 0"),
    ({"SKIPLOCK_WORKER_LEASE": "-1"}, "worker.lease"),
    ({"SKIPLOCK_WORKER_SHUTDOWN_GRACE": "-2"}, "worker.shutdown_grace (from $SKIPLOCK_WORKER_SHUTDOWN_GRACE): '-2' must be 0 or more"),
])
def test_a_bad_environment_value_names_the_setting(env, named):
    with pytest.raises(ConfigError) as info:
        load_config(env=env)
    assert named in str(info.value)


def test_a_bad_file_value_names_the_setting_and_the_file(tmp_path):
    path = write(tmp_path, '[queue]\nbackoff_base = "soon"\n')
    with pytest.raises(ConfigError, match=r"queue.backoff_base \(in .*skiplock.toml\): 'soon' is not a valid float"):
        load_config(path, env={})
    path = write(tmp_path, "[worker]\nbatch_size = 2.5\n")
    with pytest.raises(ConfigError, match="worker.batch_size"):
        load_config(path, env={})


def test_unknown_keys_and_broken_files_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="unknown setting worker.concurency"):
        load_config(write(tmp_path, "[worker]\nconcurency = 3\n"), env={})
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(write(tmp_path, "[worker\n"), env={})
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.toml", env={})
    with pytest.raises(ConfigError, match="unknown setting nope.x"):
        load_config(env={}, overrides={"nope.x": 1})


def test_lists_of_records_are_kept_for_their_owner(tmp_path):
    path = write(tmp_path, '[[webhooks]]\nname = "ops"\nurl = "http://127.0.0.1:9/hook"\n')
    assert load_config(path, env={}).tables["webhooks"] == [{"name": "ops", "url": "http://127.0.0.1:9/hook"}]


def test_unknown_lists_of_records_are_refused_like_unknown_keys(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown list of records \[\[bogus\]\]"):
        load_config(write(tmp_path, '[[bogus]]\nname = "x"\n'), env={})
    with pytest.raises(ConfigError, match=r"unknown list of records \[\[alerts.rulez\]\]"):
        load_config(write(tmp_path, '[[alerts.rulez]]\nname = "x"\n'), env={})
    with pytest.raises(ConfigError, match=r"unknown list of records \[\[worker.hosts\]\]"):
        load_config(write(tmp_path, '[worker]\nhosts = ["a", "b"]\n'), env={})
    every = "".join(f'[[{name}]]\nname = "x"\n' for name in RECORD_TABLES)
    assert set(load_config(write(tmp_path, every), env={}).tables) == set(RECORD_TABLES)
    assert {"webhooks", "alerts.rules"} <= set(RECORD_TABLES)


def test_secrets_are_masked_in_the_displayed_settings():
    config = load_config(env={"SKIPLOCK_DATABASE_DSN": "postgresql://u:pw@db/x"})
    assert config.database.dsn == "postgresql://u:pw@db/x"
    assert config.as_dict()["database"]["dsn"] == "********"


def doc_row(setting) -> str:
    default = "(empty)" if setting.default == "" else f"`{setting.default}`"
    return f"| `{setting.key}` | {setting.type.__name__} | {default} | `{setting.env_var}` | {setting.help} |"


def test_every_setting_is_documented_in_docs_configuration():
    text = DOC.read_text(encoding="utf-8")
    missing = []
    for setting in SETTINGS:
        section = re.search(rf"^## \[{re.escape(setting.section)}\]\n(.*?)(?=^## |\Z)", text, re.MULTILINE | re.DOTALL)
        row = re.search(rf"^\| `{re.escape(setting.key)}` \|(.*)$", section.group(1), re.MULTILINE) if section else None
        if row is None or setting.env_var not in row.group(1) or setting.type.__name__ not in row.group(1):
            missing.append(f"[{setting.section}]\n{doc_row(setting)}")
    assert not missing, "document these settings in docs/configuration.md (section, row):\n" + "\n".join(missing)
