"""The config file: examples load, each kind of bad config is one precise line, env overrides and
the precedence file < env < explicit, the backends' URL options as one view of the config, sources
in ``describe``, what the replay gets, and the ``config check`` / ``config show`` exit codes."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from tiered_kv.backends.file import FileOptions
from tiered_kv.backends.redis_options import RedisOptions
from tiered_kv.ops.cli import main
from tiered_kv.config import Config, describe, load_config, replay_settings, show, to_replay_settings
from tiered_kv.config.models import ControllerConfig, PoliciesConfig, PrefetchTimeoutConfig
from tiered_kv.errors import ConfigError
from tiered_kv.hierarchy import ControllerLimits, Policies, PrefetchPolicy, PrefetchTimeout, WritePolicy
from tiered_kv.ops.plan import plan_tiers, slot_bytes
from tiered_kv.model.sizes import parse_size

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "configs"


def write(tmp_path: Path, text: str, name: str = "kv.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# --- examples ----------------------------------------------------------------------------------
@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_every_example_config_loads(path: Path) -> None:
    config = load_config(path, env={})
    spec = config.kv_spec()
    tiers = plan_tiers(spec, gpu_bytes=config.l1.size, host_bytes=config.l2.size, disk_bytes=config.l3.size)
    assert all(t.pages > 0 for t in tiers)
    assert tiers[1].pages >= config.controller.batch_pages
    assert config.l3.url is None or config.l3.backend_options() is not None


def test_the_examples_the_docs_name_are_there() -> None:
    names = {p.name for p in EXAMPLES.glob("*.yaml")}
    assert names >= {"embedded.yaml", "local-ssd.yaml", "redis.yaml", "mooncake.yaml", "shared-l3-a.yaml",
                     "shared-l3-b.yaml"}


def test_examples_use_the_dev_stack_ports() -> None:
    assert load_config(EXAMPLES / "embedded.yaml", env={}).l3.url is None  # no servers at all
    redis = load_config(EXAMPLES / "redis.yaml", env={}).l3.backend_options()
    assert (redis.host, redis.port, redis.db) == ("127.0.0.1", 6379, 0)
    mooncake = load_config(EXAMPLES / "mooncake.yaml", env={}).l3.backend_options()
    assert mooncake.master == "127.0.0.1:50051"
    assert mooncake.setup_config()["metadata_server"] == "http://127.0.0.1:8080/metadata"
    ssd = load_config(EXAMPLES / "local-ssd.yaml", env={}).l3.backend_options()
    assert isinstance(ssd, FileOptions) and ssd.capacity_bytes == parse_size("64GiB")


def test_two_instances_share_one_l3_and_one_key_space() -> None:
    a = load_config(EXAMPLES / "shared-l3-a.yaml", env={})
    b = load_config(EXAMPLES / "shared-l3-b.yaml", env={})
    assert a.l3.effective_url == b.l3.effective_url
    assert a.l3.backend_options() == b.l3.backend_options()
    # The same spec and namespace name: each derives the keys of the other's pages.
    assert a.kv_spec().fingerprint == b.kv_spec().fingerprint
    assert a.spec.namespace_name == b.spec.namespace_name
    assert a.metrics.port != b.metrics.port


def test_embedded_example_runs_as_replay_settings() -> None:
    settings = replay_settings(EXAMPLES / "embedded.yaml", env={})
    assert settings.l3_url is None and settings.model == "embedded-nsa-2l"
    assert settings.policies.prefetch is PrefetchPolicy.WAIT_COMPLETE
    spec = settings.spec
    assert settings.l1_pages == parse_size("16MiB") // spec.page_bytes
    gpu, host, disk = plan_tiers(spec, gpu_bytes=parse_size("16MiB"), host_bytes=parse_size("48MiB"),
                                 disk_bytes=parse_size("1GiB"))
    assert (settings.l1_pages, settings.l2_pages, settings.l3_pages) == (gpu.pages, host.pages, disk.pages)


def test_replay_settings_carry_url_options_policies_and_limits(tmp_path: Path) -> None:
    path = write(tmp_path, f"""
spec: {{model: deepseek-v3, layers: 4}}
l1: {{size: 1GiB, device: cpu}}
l2: {{size: 2GiB}}
l3: {{size: 8GiB, url: "file://{tmp_path}/store", options: {{capacity_bytes: 8GiB, workers: 3}}}}
policies: {{write: write_back, prefetch: timeout, prefetch_timeout: {{max_s: 0.25}}}}
controller: {{batch_pages: 8, read_workers: 2}}
""")
    config = load_config(path, env={})
    s = to_replay_settings(config)
    assert s.device == "cpu" and s.model == "deepseek-v3"
    assert s.policies == Policies(write=WritePolicy.WRITE_BACK, prefetch=PrefetchPolicy.TIMEOUT,
                                  prefetch_timeout=PrefetchTimeout(max_s=0.25))
    assert s.limits == ControllerLimits(batch_pages=8, read_workers=2)
    # The replay opens the URL alone: the options are in it, and parse back into the same value.
    assert FileBackendOptions(s.l3_url) == config.l3.backend_options()
    assert config.l3.backend_options().workers == 3


def FileBackendOptions(url: str) -> FileOptions:
    from tiered_kv.config.models import BACKEND_OPTIONS

    return BACKEND_OPTIONS["file"](url, {})


# --- the backends' URL options are one view of the config --------------------------------------
def test_url_query_and_options_give_the_same_object(tmp_path: Path) -> None:
    in_url = load_config(overrides={"l3.url": "file:///x?capacity_bytes=2TiB&workers=4"}, env={})
    in_options = load_config(overrides={"l3.url": "file:///x", "l3.options": {"capacity_bytes": "2TiB", "workers": 4}},
                             env={})
    assert in_url.l3.backend_options() == in_options.l3.backend_options()
    assert in_url.l3.backend_options().capacity_bytes == 2 * 2**40


@pytest.mark.parametrize("scheme_url,key,bad", [
    ("file:///x", "capacity_bytes", "2TX"),
    ("file:///x", "workers", "0"),
    ("redis://127.0.0.1:6379/0", "ttl_s", "nan"),
    ("mooncake://127.0.0.1:50051", "replica_num", "0"),
])
def test_url_query_and_options_give_the_same_reason(scheme_url: str, key: str, bad: str) -> None:
    sep = "&" if "?" in scheme_url else "?"
    with pytest.raises(ConfigError) as in_url:
        load_config(overrides={"l3.url": f"{scheme_url}{sep}{key}={bad}"}, env={})
    with pytest.raises(ConfigError) as in_options:
        load_config(overrides={"l3.url": scheme_url, "l3.options": {key: bad}}, env={})
    reason_url = str(in_url.value).split(f"option {key}='{bad}': ", 1)[1]
    reason_options = str(in_options.value).split(f"option {key}='{bad}': ", 1)[1]
    assert reason_url == reason_options
    assert str(in_url.value).startswith("arguments: l3.url: ")
    assert str(in_options.value).startswith(f"arguments: l3.options.{key}: ")


def test_redis_options_from_the_url_parts() -> None:
    options = load_config(overrides={"l3.url": "redis://10.0.0.2:6380/3", "l3.options": {"prefix": "a:"}},
                          env={}).l3.backend_options()
    assert options == dataclasses.replace(RedisOptions(), host="10.0.0.2", port=6380, db=3, prefix="a:")


# --- bad configs: one line each, file, key path, reason ----------------------------------------
BAD = [
    ("unknown key", "l2:\n  size: 1GiB\n  sise: 2GiB\n", "l2.sise: unknown key; known: size, layout"),
    ("unknown section", "l4: {size: 1GiB}\n",
     "l4: unknown key; known: spec, l1, l2, l3, policies, controller, metrics"),
    ("wrong type", "controller: {batch_pages: many}\n", "controller.batch_pages: need an int, got 'many'"),
    ("bool for an int", "controller: {batch_pages: true}\n", "controller.batch_pages: need an int, got the bool True"),
    ("float for an int", "controller: {queue_depth: 1.5}\n", "controller.queue_depth: input should be a valid integer, got 1.5"),
    ("section not a mapping", "policies: 3\n",
     "policies: input should be a valid dictionary or instance of PoliciesConfig, got 3"),
    ("malformed size", "l2: {size: lots}\n",
     "l2.size: malformed size 'lots'; expected a number and a unit such as '64GiB' or '1.5TB'"),
    ("L2 below one batch", "spec: {model: deepseek-v3.2}\nl2: {size: 16MiB}\n",
     "l2.size: 16.00 MiB holds 5 pages of 3,084,288 B, fewer than one controller batch (controller.batch_pages = 16)"),
    ("layer_first with a zero-copy L3", "l2: {layout: layer_first}\nl3: {url: 'mooncake://127.0.0.1:50051'}\n",
     "l2.layout: layer_first host slots cannot serve the L3 backend mooncake:// (it moves whole page records "
     "zero-copy from page_first slots); use page_first"),
    ("layout not a layout", "l2: {layout: sideways}\n",
     "l2.layout: input should be 'page_first' or 'layer_first', got 'sideways'"),
    ("URL that does not parse", "l3: {url: 'redis://[::1'}\n", "l3.url: 'redis://[::1': bad host part (Invalid IPv6 URL)"),
    ("URL with a bad port", "l3: {url: 'redis://127.0.0.1:99999'}\n",
     "l3.url: redis://127.0.0.1:99999: bad port '99999'; expected 1..65535"),
    ("URL of no scheme", "l3: {url: /var/cache}\n", "l3.url: backend URL must look like scheme://..., got '/var/cache'"),
    ("unknown scheme", "l3: {url: 'http://x'}\n", "l3.url: 'http://x': unknown backend scheme 'http'; known:"),
    ("unknown option", "l3: {url: 'file:///x', options: {capacity: 1GiB}}\n",
     "l3.options.capacity: file:///x: unknown option 'capacity'; known: capacity_bytes, fsync, o_direct,"),
    ("options without a URL", "l3: {options: {workers: 2}}\n",
     "l3.options: options need l3.url (its scheme says whose options they are)"),
    ("policy number out of range", "policies: {selective_hits: 0}\n",
     "policies.selective_hits: selective_hits must be an int >= 1, got 0"),
    ("nested policy number out of range", "policies: {prefetch_timeout: {max_s: -1}}\n",
     "policies.prefetch_timeout.max_s: prefetch timeout max_s must be a finite number >= 0.0, got -1.0"),
    ("policy name", "policies: {prefetch: eventually}\n",
     "policies.prefetch: input should be 'best_effort', 'wait_complete' or 'timeout', got 'eventually'"),
    ("controller limit", "controller: {retry_max_s: 0}\n",
     "controller.retry_max_s: controller limit retry_max_s must be a finite number > 0, got 0.0"),
    ("latent dtype for MHA", "spec: {model: llama-3.1-8b, latent_dtype: fp8}\n",
     "spec.latent_dtype: llama-3.1-8b (mha) has no latent (separate k and v)"),
    ("latent dtype for MLA", "spec: {model: deepseek-v3, latent_dtype: fp8}\n",
     "spec.latent_dtype: deepseek-v3 (mla) stores its latent only as bf16"),
    ("preset and kind", "spec: {model: deepseek-v3, kind: mla, layers: 4}\n",
     "spec.kind: give spec.model (a preset) or spec.kind (an explicit spec), not both"),
    ("explicit spec without layers", "spec: {kind: nsa}\n", "spec.layers: an explicit nsa spec needs its layer count"),
    ("too many layers", "spec: {model: deepseek-v3, layers: 99}\n", "spec.layers: deepseek-v3 has 61 layers, got 99"),
    ("layer range outside", "spec: {kind: mla, layers: 8, layer_range: [4, 12]}\n",
     "spec.layer_range: layer_range (4, 12) must lie within [0, 8] and be non-empty"),
    ("metrics port", "metrics: {port: 70000}\n",
     "metrics.port: input should be less than or equal to 65535, got 70000"),
    # Passed config check, then the replay refused it without naming the file or the key.
    ("metrics host no IP address", "metrics: {enabled: true, host: localhost}\n",
     "metrics.host: metrics host must be an IP address (127.0.0.1, 0.0.0.0, ::1), got 'localhost'"),
    ("L1 of no page", "l1: {size: 1KiB}\n", "l1.size: 1.00 KiB holds no page of"),
    # Named the spec's component size under spec.kind before the spec factories checked page_size.
    ("page size 0", "spec: {page_size: 0}\n", "spec.page_size: page_size must be an int >= 1, got 0"),
    # Passed config check, then failed the replay with torch's own error.
    ("L1 on no device", "l1: {device: tpu}\n", "l1.device: expected cpu, cuda or cuda:N, got 'tpu'"),
    # Named spec.kind, not the key at fault.
    ("explicit spec of 0 layers", "spec: {kind: nsa, layers: 0}\n", "spec.layers: num_layers must be an int >= 1, got 0"),
    ("MHA head_dim out of range", "spec: {kind: mha, layers: 2, head_dim: -1}\n",
     "spec.head_dim: head_dim must be an int >= 1, got -1"),
    # 0 KV heads / head_dim 0 were read as "not given" (8 heads, 128 dims) and passed.
    ("MHA of 0 KV heads", "spec: {kind: mha, layers: 2, num_kv_heads: 0}\n",
     "spec.num_kv_heads: num_kv_heads must be an int >= 1, got 0"),
    ("MHA head_dim 0", "spec: {kind: mha, layers: 2, head_dim: 0}\n", "spec.head_dim: head_dim must be an int >= 1, got 0"),
]


@pytest.mark.parametrize("text,expected", [(t, e) for _, t, e in BAD], ids=[n for n, _, _ in BAD])
def test_bad_config_is_one_precise_line(tmp_path: Path, text: str, expected: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: {expected}"), message


@pytest.mark.parametrize("text,expected", [
    ("l2: [1, 2\n", "not valid YAML: line 2, column 1:"),
    ("l2: {size: 1GiB}\nl2: {size: 2GiB}\n", "not valid YAML: line 2, column 1: key 'l2' given twice"),
    ("- 1\n- 2\n", "the top level must be a mapping of sections, got list"),
    ("1: {size: 1GiB}\n", "1: keys are strings, got int"),
])
def test_bad_yaml_is_one_line_naming_the_file(tmp_path: Path, text: str, expected: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    assert "\n" not in str(info.value) and str(info.value).startswith(f"{path}: {expected}"), str(info.value)


def test_file_problems(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"kv\.ini: unknown config format; use \.yaml, \.yml, \.toml"):
        load_config(write(tmp_path, "", "kv.ini"), env={})
    with pytest.raises(ConfigError, match=r"missing\.yaml: cannot read:"):
        load_config(tmp_path / "missing.yaml", env={})
    with pytest.raises(ConfigError, match=r"kv\.toml: not valid TOML:"):
        load_config(write(tmp_path, "[l2\n", "kv.toml"), env={})


def test_toml_and_yaml_give_the_same_config(tmp_path: Path) -> None:
    toml = write(tmp_path, '[spec]\nmodel = "deepseek-v3"\nlayers = 4\n[l2]\nsize = "2GiB"\n'
                           '[l3]\nurl = "memory://"\n[l3.options]\ncapacity_bytes = "1GiB"\n', "kv.toml")
    yaml_ = write(tmp_path, "spec: {model: deepseek-v3, layers: 4}\nl2: {size: 2GiB}\n"
                            "l3: {url: 'memory://', options: {capacity_bytes: 1GiB}}\n")
    a, b = load_config(toml, env={}), load_config(yaml_, env={})
    assert a.model_dump() == b.model_dump() and a.l2.size == 2 * 2**30 and a.l3.backend_options().capacity_bytes == 2**30


def test_empty_file_is_the_defaults(tmp_path: Path) -> None:
    assert load_config(write(tmp_path, ""), env={}).model_dump() == load_config(env={}).model_dump() == Config().model_dump()


# --- environment and precedence ----------------------------------------------------------------
def test_env_overrides_nested_keys() -> None:
    config = load_config(env={"TIERED_KV_L2__SIZE": "64GiB", "TIERED_KV_POLICIES__PREFETCH_TIMEOUT__MAX_S": "0.5",
                              "TIERED_KV_METRICS__ENABLED": "true", "tiered_kv_controller__batch_pages": "8",
                              "TIERED_KV_L3__URL": "file:///x", "TIERED_KV_L3__OPTIONS__WORKERS": "3",
                              "UNRELATED": "1"})
    assert config.l2.size == 64 * 2**30
    assert config.policies.prefetch_timeout.max_s == 0.5 and config.metrics.enabled is True
    assert config.controller.batch_pages == 8 and config.l3.backend_options().workers == 3


def test_env_section_as_json() -> None:
    config = load_config(env={"TIERED_KV_METRICS": '{"enabled": true, "port": 9500}'})
    assert (config.metrics.enabled, config.metrics.port) == (True, 9500)
    with pytest.raises(ConfigError, match=r"^TIERED_KV_METRICS: port: input should be less than or equal to 65535"):
        load_config(env={"TIERED_KV_METRICS": '{"port": 70000}'})


@pytest.mark.parametrize("env,expected", [
    ({"TIERED_KV_L2__SIZE": "lots"}, "TIERED_KV_L2__SIZE: malformed size 'lots'"),
    ({"TIERED_KV_L2__SIZEE": "1GiB"}, "TIERED_KV_L2__SIZEE: unknown key; known: size, layout"),
    ({"TIERED_KV_L2SIZE": "1GiB"}, "TIERED_KV_L2SIZE: unknown key 'l2size'; known: spec, l1,"),
    ({"TIERED_KV_POLICIES__SELECTIVE_HITS": "0"}, "TIERED_KV_POLICIES__SELECTIVE_HITS: selective_hits must be an int >= 1"),
    ({"TIERED_KV_METRICS__ENABLED": "maybe"}, "TIERED_KV_METRICS__ENABLED: need a bool"),
    ({"TIERED_KV_L3__URL": "file:///x", "TIERED_KV_L3__OPTIONS__WORKERS": "0"},
     "TIERED_KV_L3__OPTIONS__WORKERS: file:///x: option workers='0': need workers > 0"),
    ({"TIERED_KV_METRICS": "{bad"}, "TIERED_KV_METRICS: not valid JSON for a section"),
])
def test_bad_env_names_the_variable(env: dict, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(env=env)
    assert "\n" not in str(info.value) and str(info.value).startswith(expected), str(info.value)


def test_an_env_section_replacing_a_file_value_is_blamed_on_the_variable(tmp_path: Path) -> None:
    # The variable's section replaced the file's l2.size; the error named the file.
    path = write(tmp_path, "l2: {size: 2GiB}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path, env={"TIERED_KV_L2__SIZE__X": "1"})
    assert str(info.value).startswith("TIERED_KV_L2__SIZE__X: "), str(info.value)
    with pytest.raises(ConfigError) as info:
        load_config(path, overrides={"l2.size.x": 1}, env={})
    assert str(info.value).startswith("arguments: l2.size: "), str(info.value)


def test_precedence_file_then_env_then_explicit(tmp_path: Path) -> None:
    path = write(tmp_path, "l1: {size: 1GiB}\nl2: {size: 2GiB}\nl3: {size: 3GiB}\nmetrics: {port: 9001}\n")
    env = {"TIERED_KV_L2__SIZE": "20GiB", "TIERED_KV_L3__SIZE": "30GiB"}
    config = load_config(path, overrides={"l3.size": "300GiB"}, env=env)
    assert (config.l1.size, config.l2.size, config.l3.size) == (2**30, 20 * 2**30, 300 * 2**30)
    assert config.metrics.port == 9001  # a section's other keys survive an override of one
    sources = {s.key: (s.source, s.origin) for s in describe(config)}
    assert sources["l1.size"] == ("file", str(path))
    assert sources["l2.size"] == ("env", "TIERED_KV_L2__SIZE")
    assert sources["l3.size"] == ("argument", "arguments")
    assert sources["controller.batch_pages"] == ("default", "default")
    # Nested overrides are the same as dotted ones.
    assert load_config(path, overrides={"l3": {"size": "300GiB"}}, env=env).model_dump() == config.model_dump()


def test_an_explicit_value_that_is_wrong_names_the_arguments(tmp_path: Path) -> None:
    path = write(tmp_path, "l2: {size: 2GiB}\n")
    with pytest.raises(ConfigError, match=r"^arguments: l2\.size: malformed size 'x'"):
        load_config(path, overrides={"l2.size": "x"}, env={"TIERED_KV_L2__SIZE": "4GiB"})


def test_config_path_from_env(tmp_path: Path) -> None:
    path = write(tmp_path, "metrics: {port: 9123}\n")
    assert load_config(env={"TIERED_KV_CONFIG": str(path)}).metrics.port == 9123


def test_describe_reports_backend_options_and_their_sources(tmp_path: Path) -> None:
    path = write(tmp_path, "l3: {url: 'file:///x?workers=5', options: {capacity_bytes: 1GiB}}\n")
    config = load_config(path, env={"TIERED_KV_L3__OPTIONS__FSYNC": "false"})
    got = {s.key: s for s in describe(config)}
    assert (got["l3.backend.workers"].value, got["l3.backend.workers"].source) == (5, "file")
    assert (got["l3.backend.capacity_bytes"].value, got["l3.backend.capacity_bytes"].source) == (2**30, "file")
    assert (got["l3.backend.fsync"].value, got["l3.backend.fsync"].origin) == (False, "TIERED_KV_L3__OPTIONS__FSYNC")
    assert got["l3.backend.o_direct"].source == "default"
    assert got["l3.backend.path"].value == "/x"
    as_json = json.loads(show(config, as_json=True))
    assert as_json["l3.options.fsync"] == {"value": "false", "source": "env", "origin": "TIERED_KV_L3__OPTIONS__FSYNC"}


# --- the tree mirrors the hierarchy's values ----------------------------------------------------
@pytest.mark.parametrize("section,target", [(PoliciesConfig, Policies), (PrefetchTimeoutConfig, PrefetchTimeout),
                                            (ControllerConfig, ControllerLimits)])
def test_mirrored_sections_have_exactly_the_dataclass_fields(section, target) -> None:
    fields = {f.name: f for f in dataclasses.fields(target)}
    assert list(section.model_fields) == list(fields)
    built = section().build()
    assert built == target()


# --- CLI ---------------------------------------------------------------------------------------
def test_config_check_ok(tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TIERED_KV_CONFIG", raising=False)
    path = str(EXAMPLES / "redis.yaml")
    assert main(["config", "check", path]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith(f"ok: {path}: deepseek-v3.2 (nsa") and "redis://127.0.0.1:6379/0" in out[0]


def test_config_check_bad_is_exit_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = write(tmp_path, "policies: {selective_hits: 0}\n")
    assert main(["config", "check", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"tiered-kv: error: {path}: policies.selective_hits: selective_hits must be an int >= 1, got 0\n"


def test_config_check_needs_a_file(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as info:
        main(["config", "check"])
    assert info.value.code == 2


def test_config_show_text_and_json(tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIERED_KV_METRICS__PORT", "9555")
    path = write(tmp_path, "l2: {size: 2GiB}\n")
    assert main(["config", "show", str(path)]) == 0
    text = capsys.readouterr().out
    assert any(line.startswith("l2.size ") and "2147483648 (2.00 GiB)" in line and f"[file: {path}]" in line
               for line in text.splitlines())
    assert any(line.startswith("metrics.port ") and "[env: TIERED_KV_METRICS__PORT]" in line for line in text.splitlines())
    assert main(["config", "show", str(path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["l2.size"] == {"value": 2 * 2**30, "source": "file", "origin": str(path)}
    assert data["metrics.port"]["value"] == 9555 and data["policies.write"]["source"] == "default"
    assert set(data) >= {s.key for s in describe(load_config(path))}


def test_config_show_bad_env_is_exit_2(capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TIERED_KV_CONFIG", raising=False)
    monkeypatch.setenv("TIERED_KV_L2__SIZE", "lots")
    assert main(["config", "show"]) == 2
    assert capsys.readouterr().err.startswith("tiered-kv: error: TIERED_KV_L2__SIZE: malformed size 'lots'")


def test_replay_runs_the_config_file_with_flags_winning(capsys: pytest.CaptureFixture,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TIERED_KV_CONFIG", raising=False)
    embedded = str(EXAMPLES / "embedded.yaml")
    settings = replay_settings(embedded, env={})
    host = 2 * settings.l2_pages * (settings.spec.page_bytes + 4096)  # roughly twice the file's L2
    code = main(["replay", "--config", embedded, "--simulate", "--clients", "2", "--rounds", "2", "--json", "--quiet",
                 "--host-mem", str(host)])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert out["tier_pages"]["l1"] == settings.l1_pages and out["tier_pages"]["l3"] == settings.l3_pages
    assert out["tier_pages"]["l2"] == settings.with_sizes(host_bytes=host).l2_pages != settings.l2_pages


def test_replay_reads_the_config_named_by_tiered_kv_config_with_its_environment(capsys: pytest.CaptureFixture,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """``$TIERED_KV_CONFIG`` names the file for ``replay`` as for ``config show`` (file < environment
    < flags); with neither it and ``--config`` the replay runs the embedded default, under the
    environment all the same."""
    from tiered_kv.ops.replay import embedded_default

    embedded = str(EXAMPLES / "embedded.yaml")
    env = {"TIERED_KV_L2__SIZE": "6MiB"}
    expected = replay_settings(embedded, env=env)
    assert expected.l2_pages != embedded_default().l2_pages  # the run below can tell them apart
    monkeypatch.setenv("TIERED_KV_CONFIG", embedded)
    monkeypatch.setenv("TIERED_KV_L2__SIZE", "6MiB")
    assert main(["replay", "--simulate", "--clients", "2", "--rounds", "2", "--json", "--quiet"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["tier_pages"]["l2"] == expected.l2_pages and out["tier_pages"]["l1"] == expected.l1_pages
    monkeypatch.delenv("TIERED_KV_CONFIG")  # no file: the environment applies over the embedded default
    assert main(["replay", "--simulate", "--clients", "2", "--rounds", "2", "--json", "--quiet"]) == 0
    out = json.loads(capsys.readouterr().out)["tier_pages"]
    assert out["l2"] == replay_settings(env=env).l2_pages == 6 * 2**20 // slot_bytes(embedded_default().spec)
    assert out["l1"] == embedded_default().l1_pages
    monkeypatch.delenv("TIERED_KV_L2__SIZE")
    assert main(["replay", "--simulate", "--clients", "2", "--rounds", "2", "--json", "--quiet"]) == 0
    assert json.loads(capsys.readouterr().out)["tier_pages"]["l2"] == embedded_default().l2_pages


def _replay_json(capsys: pytest.CaptureFixture, *args: str) -> dict:
    assert main(["replay", "--simulate", "--clients", "2", "--rounds", "2", "--json", "--quiet", *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_replay_without_a_file_takes_the_environment_over_the_embedded_default(
        capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """file < environment < flags holds with no file too: the embedded default stands in for the
    file, and a bad or unknown TIERED_KV_* variable is refused as config show refuses it."""
    from tiered_kv.ops.replay import embedded_default

    monkeypatch.delenv("TIERED_KV_CONFIG", raising=False)
    default = embedded_default()
    monkeypatch.setenv("TIERED_KV_L2__SIZE", "96MiB")
    monkeypatch.setenv("TIERED_KV_POLICIES__MIN_HIT_TOKENS", "64")
    out = _replay_json(capsys)
    assert out["tier_pages"] == {"l1": default.l1_pages, "l2": 96 * 2**20 // slot_bytes(default.spec),
                                 "l3": default.l3_pages}
    assert _replay_json(capsys, "--host-mem", "8MiB")["tier_pages"]["l2"] == 8 * 2**20 // slot_bytes(default.spec)
    for name, value, message in (("TIERED_KV_L2__SIZE", "lots", "TIERED_KV_L2__SIZE: malformed size 'lots'"),
                                 ("TIERED_KV_BOGUS", "1", "TIERED_KV_BOGUS: unknown key 'bogus'")):
        monkeypatch.setenv(name, value)
        assert main(["replay", "--simulate", "--clients", "2", "--rounds", "2", "--json", "--quiet"]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"tiered-kv: error: {message}") and err.count("\n") == 1
        monkeypatch.delenv(name)


def test_replay_serves_metrics_the_environment_enables_without_a_file(monkeypatch: pytest.MonkeyPatch) -> None:
    from tiered_kv.ops.cli import build_parser
    from tiered_kv.ops.replay.cli import metrics_address, run_config

    monkeypatch.delenv("TIERED_KV_CONFIG", raising=False)
    args = build_parser().parse_args(["replay", "--simulate"])
    assert metrics_address(args, run_config(args)) is None
    monkeypatch.setenv("TIERED_KV_METRICS__ENABLED", "true")
    monkeypatch.setenv("TIERED_KV_METRICS__PORT", "9577")
    assert metrics_address(args, run_config(args)) == ("127.0.0.1", 9577)
    args = build_parser().parse_args(["replay", "--simulate", "--metrics-port", "9578"])
    assert metrics_address(args, run_config(args)) == ("127.0.0.1", 9578)  # the flag wins


def test_config_show_without_a_file_is_what_replay_runs_without_one(capsys: pytest.CaptureFixture,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from tiered_kv.ops.replay import embedded_default
    from tiered_kv.compose import embedded_config

    monkeypatch.delenv("TIERED_KV_CONFIG", raising=False)
    assert to_replay_settings(load_config(env={}, defaults=embedded_config())) == embedded_default()
    assert replay_settings(env={}) == embedded_default()
    monkeypatch.setenv("TIERED_KV_L3__SIZE", "2GiB")
    assert main(["config", "show", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["spec.name"] == {"value": "embedded-nsa-2l", "source": "default", "origin": "default"}
    assert data["l2.size"]["value"] == embedded_default().l2_pages * slot_bytes(embedded_default().spec)
    assert data["policies.prefetch"]["value"] == "wait_complete"
    assert data["l3.size"] == {"value": 2 * 2**30, "source": "env", "origin": "TIERED_KV_L3__SIZE"}
    # A model named above the embedded default replaces its whole spec (no model-and-kind clash).
    monkeypatch.setenv("TIERED_KV_SPEC__MODEL", "llama-3.1-8b")
    assert main(["config", "show", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["spec.model"]["value"] == "llama-3.1-8b" and data["spec.kind"]["value"] is None


def test_model_beside_a_config_keeps_the_sizes_the_file_gives(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Sizing flags beside a config file, the flags winning: only the flags given.
    --model switches the spec; the file's (and the environment's) sizes stay, in pages of it."""
    monkeypatch.delenv("TIERED_KV_CONFIG", raising=False)
    path = write(tmp_path, "spec: {kind: nsa, layers: 4, name: mine}\nl1: {size: 16MiB}\nl2: {size: 48MiB}\n"
                           "l3: {size: 1GiB}\n")
    base = replay_settings(path, env={})
    switched = _replay_json(capsys, "--config", str(path), "--model", "deepseek-v3.2", "--layers", "2")
    spec = replay_settings(path, {"spec": {"model": "deepseek-v3.2", "kind": None, "layers": 2, "name": None}},
                           env={}).spec
    tiers = plan_tiers(spec, gpu_bytes=16 * 2**20, host_bytes=48 * 2**20, disk_bytes=2**30)
    assert switched["tier_pages"] == {"l1": tiers[0].pages, "l2": tiers[1].pages, "l3": tiers[2].pages}
    assert switched["tier_pages"] != {"l1": base.l1_pages, "l2": base.l2_pages, "l3": base.l3_pages}  # 2 layers, not 4
    assert switched["spec"] == spec.describe()
    flagged = _replay_json(capsys, "--config", str(path), "--model", "deepseek-v3.2", "--layers", "2",
                           "--host-mem", "96MiB")
    assert flagged["tier_pages"] == {**switched["tier_pages"], "l2": 96 * 2**20 // slot_bytes(spec)}
    monkeypatch.setenv("TIERED_KV_L3__SIZE", "2GiB")  # the environment's size stays too
    env_sized = _replay_json(capsys, "--config", str(path), "--model", "deepseek-v3.2", "--layers", "2")
    assert env_sized["tier_pages"] == {**switched["tier_pages"], "l3": 2 * 2**30 // slot_bytes(spec)}
    monkeypatch.delenv("TIERED_KV_L3__SIZE")
    # No file: --model sizes the tiers as plan does (64GiB / 512GiB / 4TiB), unless a flag is given.
    planned = _replay_json(capsys, "--model", "deepseek-v3.2", "--layers", "2", "--gpu-mem", "1GiB")
    tiers = plan_tiers(spec, gpu_bytes=2**30, host_bytes=512 * 2**30, disk_bytes=4 * 2**40)
    assert planned["tier_pages"] == {"l1": tiers[0].pages, "l2": tiers[1].pages, "l3": tiers[2].pages}
