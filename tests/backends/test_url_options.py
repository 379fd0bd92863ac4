"""Backend URL options: every URL part and every option value is checked when the URL is parsed,
and only ConfigError comes out, one line naming the URL, the option and the value."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated

import pytest
from pydantic import BaseModel, Field, ValidationError

from tiered_kv import HostPool
from tiered_kv.backends import open_backend
from tiered_kv.backends.file import FileBackend, FileOptions
from tiered_kv.backends.memory import MemoryOptions
from tiered_kv.ops.bench.raw_ceilings import measure_raw_ceiling
from tiered_kv.backends.mooncake import MooncakeOptions
from tiered_kv.backends.redis_options import RedisOptions, parse_redis_url
from tiered_kv.backends.url_options import check_fields, options_from_url, split_url
from tiered_kv.errors import ConfigError

from .contract import SPEC

# URLs urllib.parse.urlsplit (or SplitResult.port) refuses with a plain ValueError.
SPLIT_REFUSED = [
    ("redis://[::1", "bad host part"),  # unbalanced bracket
    ("redis://[::1x]:6379/0", "bad host part"),  # not an IPv6 literal
    ("redis://[1.2.3.4]/0", "bad host part"),  # IPv4 in brackets
    ("redis://[::g]/0", "bad host part"),
    ("redis://ho\uff0fst:6379/0", "NFKC"),  # a fullwidth solidus normalises to "/"
    ("rediss://h\u2100st/0", "NFKC"),  # "a/c"
    ("mooncake://[::1:5000", "bad host part"),
    ("mooncake://m\uff03aster:5000", "NFKC"),
    ("file://[::1/tmp/x", "bad host part"),
    ("memory://[?capacity_bytes=1GiB", "bad host part"),
    ("unix://[/run/redis.sock", "bad host part"),
    ("vault://[::1", "bad host part"),  # before the scheme lookup: no plain ValueError either
]


@pytest.fixture
def pool():
    with HostPool(SPEC, 2) as pool:
        yield pool


@pytest.mark.parametrize("url, message", SPLIT_REFUSED)
def test_urls_the_splitter_refuses_are_config_errors(pool, url, message):
    with pytest.raises(ConfigError, match=message) as info:
        open_backend(url, pool)
    assert url in str(info.value) or repr(url) in str(info.value)


@pytest.mark.parametrize("parse", [
    lambda url: parse_redis_url(url, {}),
    MooncakeOptions.from_url,
    lambda url: FileBackend.from_url(url, None),  # refused before the pool is looked at
], ids=["redis", "mooncake", "file"])
def test_each_backend_parser_maps_split_errors(parse):
    for url in ("redis://[::1", "mooncake://[::1", "file://[::1/x", "x://ho\uff0fst"):
        with pytest.raises(ConfigError, match="bad host part"):
            parse(url)


@pytest.mark.parametrize("url", ["redis://h:65536/0", "redis://h:-1/0", "redis://h:1e3/0",
                                 "mooncake://h:65536", "mooncake://h:99999999999999999999", "mooncake://h:port"])
def test_ports_out_of_range_name_the_port(url):
    parse = MooncakeOptions.from_url if url.startswith("mooncake") else (lambda u: parse_redis_url(u, {}))
    with pytest.raises(ConfigError, match=r"bad port '[^']*'; expected 1\.\.65535"):
        parse(url)


# What each scheme's ``from_url`` does before it opens anything.
PARSE = {
    "redis": lambda url, pool: parse_redis_url(url, {}),
    "mooncake": lambda url, pool: MooncakeOptions.from_url(url),
    "file": lambda url, pool: options_from_url(FileOptions, url, path=split_url(url).path),
    "memory": lambda url, pool: open_backend(url, pool),
}


@pytest.mark.parametrize("url, key, value, reason", [
    ("redis://h/0?ttl_s=nan", "ttl_s", "nan", "need a finite number"),
    ("redis://h/0?ttl_s=inf", "ttl_s", "inf", "need a finite number"),
    ("redis://h/0?ttl_s=-inf", "ttl_s", "-inf", "need a finite number"),
    ("redis://h/0?ttl_s=1e400", "ttl_s", "1e400", "need a finite number"),
    ("redis://h/0?ttl_s=1e30", "ttl_s", "1e30", "need ttl_s <= "),
    ("redis://h/0?ttl_s=-1", "ttl_s", "-1", "need ttl_s >= 0"),
    ("redis://h/0?socket_timeout_s=1e300", "socket_timeout_s", "1e300", "need socket_timeout_s <= "),
    ("redis://h/0?connect_timeout_s=NaN", "connect_timeout_s", "NaN", "need a finite number"),
    ("redis://h/0?max_in_flight=1e3", "max_in_flight", "1e3", "not a valid int"),
    ("redis://h/0?max_in_flight=" + "9" * 400, "max_in_flight", "9" * 400, "not a valid int"),
    ("redis://h/0?max_in_flight=99999", "max_in_flight", "99999", "need max_in_flight <= 1024"),
    ("redis://h?db=99999999999", "db", "99999999999", "need db <= 2147483647"),
    ("redis://h/0?zero_copy=2", "zero_copy", "2", "not a bool"),
    ("file:///tmp/x?timeout_s=inf", "timeout_s", "inf", "need a finite number"),
    ("file:///tmp/x?stale_temp_s=nan", "stale_temp_s", "nan", "need a finite number"),
    ("file:///tmp/x?stale_temp_s=0", "stale_temp_s", "0", "need stale_temp_s > 0"),
    ("file:///tmp/x?capacity_bytes=1e400GiB", "capacity_bytes", "1e400GiB", "malformed size"),
    ("file:///tmp/x?capacity_bytes=" + "9" * 400, "capacity_bytes", "9" * 400, "too large"),
    ("file:///tmp/x?workers=100000", "workers", "100000", "need workers <= 1024"),
    ("file:///tmp/x?workers=4.0", "workers", "4.0", "not a valid int"),
    ("mooncake://h:5000?timeout_s=nan", "timeout_s", "nan", "need a finite number"),
    ("mooncake://h:5000?global_segment_bytes=" + "9" * 30 + "GiB", "global_segment_bytes", "9" * 30 + "GiB", "too large"),
    ("mooncake://h:5000?replica_num=1000", "replica_num", "1000", "need replica_num <= 64"),
    ("mooncake://h:5000?transfers_in_flight=2**3", "transfers_in_flight", "2**3", "not a valid int"),
    ("mooncake://h:5000?local_hostname=a%20b", "local_hostname", "a b", "not a host name"),
    ("memory://?capacity_bytes=0", "capacity_bytes", "0", "need capacity_bytes > 0"),
])
def test_every_numeric_option_is_checked_at_parse_time(pool, url, key, value, reason):
    with pytest.raises(ConfigError) as info:
        PARSE[url.partition(":")[0]](url, pool)  # parsing only: no server is reached
    message = str(info.value)
    assert message.startswith(f"{url}: option {key}={value!r}: "), message
    assert reason in message
    assert "\n" not in message


def test_redis_ttl_of_nan_or_inf_is_refused_at_open_not_at_the_first_put(pool):
    """Before, ``?ttl_s=nan`` opened a backend whose first put failed on ``math.ceil(nan)``."""
    for bad in (math.nan, math.inf, 1e300):
        with pytest.raises(ConfigError, match="option ttl_s="):
            open_backend("redis://127.0.0.1:1/0", pool, ttl_s=bad)
        with pytest.raises(ConfigError, match="RedisOptions: option ttl_s="):
            RedisOptions(ttl_s=bad)
    assert RedisOptions(ttl_s=0.0004).ttl_ms == 1


@pytest.mark.parametrize("options, message", [
    ({"max_in_flight": True}, "option max_in_flight=True: input should be a valid integer"),
    ({"max_in_flight": 2.0}, "option max_in_flight=2.0: input should be a valid integer"),
    ({"zero_copy": 1}, "option zero_copy=1: input should be a valid boolean"),
    ({"prefix": b"tkv:"}, "option prefix=b'tkv:': input should be a valid string"),
    ({"socket_timeout_s": float("nan")}, "need a finite number"),
])
def test_typed_keyword_options_are_checked_strictly(options, message):
    with pytest.raises(ConfigError, match=message):
        parse_redis_url("redis://h:6379/0", options)
    # ints are fine where floats are wanted, strings are read as in the URL
    got = parse_redis_url("redis://h:6379/0", {"socket_timeout_s": 3, "max_in_flight": "4", "zero_copy": "off"})
    assert (got.socket_timeout_s, got.max_in_flight, got.zero_copy) == (3.0, 4, False)


def test_direct_construction_uses_the_same_checks():
    with pytest.raises(ConfigError, match="FileOptions: option workers=True"):
        FileOptions(path="/tmp/x", workers=True)
    with pytest.raises(ConfigError, match="FileOptions: option timeout_s=inf: need a finite number"):
        FileOptions(path="/tmp/x", timeout_s=math.inf)
    with pytest.raises(ConfigError, match="MemoryOptions: option capacity_bytes=-1"):
        MemoryOptions(capacity_bytes=-1)
    with pytest.raises(ConfigError, match="MooncakeOptions: option replica_num=0: need replica_num >= 1"):
        MooncakeOptions(master="h:1", replica_num=0)


def test_repeated_keys_and_keys_the_url_gives_are_refused():
    with pytest.raises(ConfigError, match="option ttl_s given twice"):
        parse_redis_url("redis://h/0?ttl_s=1&ttl_s=2", {})
    with pytest.raises(ConfigError, match="master comes from the URL itself"):
        MooncakeOptions.from_url("mooncake://h:5000?master=elsewhere:1")
    with pytest.raises(ConfigError, match="path comes from the URL itself"):
        options_from_url(FileOptions, "file:///tmp/x?path=/etc", path="/tmp/x")
    with pytest.raises(ConfigError, match="unknown option 'colour'"):
        parse_redis_url("redis://h/0", {"colour": "red"})


def test_cross_field_checks_keep_their_message_behind_the_url():
    url = "mooncake://h:5000?workers=2&transfers_in_flight=3"
    with pytest.raises(ConfigError, match=r"^mooncake://h:5000\?workers=2&transfers_in_flight=3: mooncake: transfers_in_flight"):
        MooncakeOptions.from_url(url)


def test_optional_fields_take_an_empty_value_as_unset():
    assert MooncakeOptions.from_url("mooncake://h:5000?global_segment_bytes=").global_segment_bytes is None
    assert MooncakeOptions.from_url("mooncake://h:5000?global_segment_bytes=2MiB").global_segment_bytes == 2 << 20


def test_options_dataclasses_are_fields_of_a_pydantic_model_with_the_same_constraints():
    """The config file holds these dataclasses in one typed tree: pydantic reads their
    Annotated constraints there too, so the URL and the file cannot disagree."""

    class Tree(BaseModel):
        redis: RedisOptions
        file: FileOptions

    tree = Tree.model_validate({"redis": {"host": "cache", "ttl_s": "30"}, "file": {"path": "/mnt/kv", "workers": 2}})
    assert tree.redis.ttl_s == 30.0 and tree.redis.host == "cache" and tree.file.workers == 2
    for bad in ({"ttl_s": "nan"}, {"ttl_s": 1e30}, {"max_in_flight": 0}, {"port": 70000}):
        with pytest.raises(ValidationError):
            Tree.model_validate({"redis": bad, "file": {"path": "/mnt/kv"}})


def test_a_backend_s_own_dataclass_gets_constraints_by_annotation():
    @dataclass(frozen=True)
    class Options:
        level: Annotated[int, Field(ge=1, le=9)] = 5
        ratio: float = 0.5

        def __post_init__(self) -> None:
            check_fields(self)

    assert options_from_url(Options, "x://h?level=9&ratio=2").level == 9
    with pytest.raises(ConfigError, match=r"^x://h\?level=10: option level='10': need level <= 9$"):
        options_from_url(Options, "x://h?level=10")
    # floats are finite even without a declared constraint
    with pytest.raises(ConfigError, match="option ratio='inf': need a finite number"):
        options_from_url(Options, "x://h?ratio=inf")
    with pytest.raises(ConfigError, match="Options: option ratio=nan"):
        Options(ratio=math.nan)


def test_the_file_bench_reads_workers_through_the_same_parser(tmp_path):
    """``bench storage`` read ``workers`` with a bare int(): ``workers=x`` was a ValueError."""
    for value, reason in (("x", "not a valid int"), ("0", "need workers > 0"), ("1e9", "not a valid int")):
        with pytest.raises(ConfigError, match=f"option workers='{value}': {reason}"):
            measure_raw_ceiling(f"file://{tmp_path}?workers={value}", page_bytes=4096, pages=1)
