"""The ``security`` section: the tenant salt and the record secret, from a file or the environment,
and the secret never shown (``config show``, ``config check``, errors, reprs)."""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import pytest

from tiered_kv.config import load_config, show, to_replay_settings
from tiered_kv.errors import ConfigError
from tiered_kv.model.record_key import RecordKey
from tiered_kv.ops.cli import main

SECRET = "s3cr3t-" + secrets.token_hex(24)


def test_the_secret_from_the_environment_is_masked_everywhere(monkeypatch, capsys):
    env = {"TIERED_KV_SECURITY__SECRET": SECRET, "TIERED_KV_SECURITY__TENANT": "acme"}
    config = load_config(env=env)
    assert config.security.secret.get_secret_value() == SECRET and config.security.tenant == "acme"
    assert config.security.record_key() == RecordKey(SECRET)
    table, as_json = show(config), json.loads(show(config, as_json=True))
    assert as_json["security.secret"] == {"value": "**********", "source": "env", "origin": "TIERED_KV_SECURITY__SECRET"}
    assert as_json["security.tenant"]["value"] == "acme"
    summary = config.summary()
    assert f"key id {RecordKey(SECRET).key_id.hex()}" in summary
    settings = to_replay_settings(config)
    for text in (table, json.dumps(as_json), summary, repr(config), str(config), repr(settings)):
        assert SECRET not in text
    monkeypatch.setenv("TIERED_KV_SECURITY__SECRET", SECRET)
    assert main(["config", "show", "--json"]) == 0
    out = capsys.readouterr().out
    assert SECRET not in out and json.loads(out)["security.secret"]["value"] == "**********"


def test_no_secret_is_the_default_and_shows_as_null():
    config = load_config(env={})
    assert config.security.secret is None and config.security.tenant == "" and config.security.record_key() is None
    assert json.loads(show(config, as_json=True))["security.secret"]["value"] is None
    assert "records keyed" not in config.summary()


@pytest.mark.parametrize(("value", "reason"), [
    ("short-secret", "at least 16 bytes, got 12"),
    (123456789012345678901234567890, "a secret is text, got int"),
])
def test_a_bad_secret_is_one_line_that_never_repeats_it(tmp_path: Path, value, reason):
    path = tmp_path / "kv.yaml"
    path.write_text(f"security:\n  secret: {value}\n")
    with pytest.raises(ConfigError) as found:
        load_config(path, env={})
    assert str(found.value).startswith(f"{path}: security.secret: ") and reason in str(found.value)
    assert str(value) not in str(found.value)
    with pytest.raises(ConfigError) as from_env:
        load_config(env={"TIERED_KV_SECURITY__SECRET": str(value)[:12]})
    assert str(from_env.value).startswith("TIERED_KV_SECURITY__SECRET: ") and str(value)[:12] not in str(from_env.value)


def test_config_check_and_show_of_a_file_never_print_the_secret(tmp_path: Path, capsys):
    path = tmp_path / "kv.yaml"
    path.write_text(f"security:\n  tenant: acme\n  secret: '{SECRET}'\n")
    assert main(["config", "check", str(path)]) == 0
    assert main(["config", "show", str(path)]) == 0
    out = capsys.readouterr().out
    assert SECRET not in out and "**********" in out and "records keyed" in out
