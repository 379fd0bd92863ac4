"""Fuzzing the parsers of outside input: only the library's own errors may come out.

The backend URL and option parsers (every scheme), the size parser and the page key validator
get random text, numbers and objects; anything but a ``TieredKVError`` fails the test. Nothing
here opens a connection: URLs of server backends go to their option parsers, and only
``memory://`` and garbage URLs go through ``open_backend``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tiered_kv import HostPool
from tiered_kv.backends import open_backend
from tiered_kv.backends.file import FileBackend, FileOptions
from tiered_kv.backends.memory import MemoryOptions
from tiered_kv.backends.mooncake import MooncakeOptions
from tiered_kv.backends.redis_options import RedisOptions, parse_redis_url
from tiered_kv.backends.url_options import options_from_url
from tiered_kv.errors import TieredKVError
from tiered_kv.model.keys import MAX_KEY_BYTES, check_key
from tiered_kv.model.sizes import MAX_SIZE, parse_size

from .backends.contract import SPEC

FUZZ = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

OPTION_KEYS = sorted({f.name for cls in (RedisOptions, FileOptions, MooncakeOptions, MemoryOptions)
                      for f in dataclasses.fields(cls)})
NUMBERISH = st.from_regex(r"\A[+-]?[0-9]{0,40}(\.[0-9]{0,20})?([eE][+-]?[0-9]{1,4})?\s?[A-Za-z]{0,3}\Z")
SPECIAL = st.sampled_from(["nan", "-nan", "inf", "-inf", "Infinity", "1e400", "1e-400", "9" * 400, "-0", "0x10",
                           "1_000", "\u0663", "\uff11", "true", "off", "", " ", "64GiB", "1e400GiB", "%00", "\x00"])
VALUES = st.one_of(SPECIAL, NUMBERISH, st.text(max_size=30))
QUERY = st.lists(st.tuples(st.one_of(st.sampled_from(OPTION_KEYS), st.text(max_size=12)), VALUES), max_size=5)
# Hosts: ASCII names, addresses, brackets, ports out of range, and any Unicode (NFKC troublemakers too).
HOSTS = st.one_of(
    st.sampled_from(["h", "127.0.0.1", "[::1]", "[::1", "::1]", "[1.2.3.4]", "[::g]", "h:0", "h:65536", "h:-1", "h:x",
                     "h:99999999999999999999", "ho\uff0fst", "h\u2100", "m\uff03x", "u:p@h", "@", ":", "", "[", "]",
                     "h%00", "xn--zz", "\u00e9t\u00e9.example", "a..b", "a" * 300]),
    st.text(max_size=20),
    st.builds(lambda h, p: f"{h}:{p}", st.text(max_size=8), st.integers(-10, 10**6)),
)
PATHS = st.one_of(st.sampled_from(["", "/", "/0", "/15", "/abc", "/-1", "/\u00b2", "/" + "9" * 30, "/0/1"]),
                  st.text(max_size=10).map(lambda t: "/" + t))


def _query(pairs: list[tuple[str, str]], raw: bool) -> str:
    if raw:  # as typed: & = % # unescaped
        return "&".join(f"{k}={v}" for k, v in pairs)
    return "&".join(f"{quote(k, safe='')}={quote(v, safe='')}" for k, v in pairs)


@st.composite
def urls(draw, schemes: list[str]) -> str:
    scheme = draw(st.sampled_from(schemes))
    host, path = draw(HOSTS), draw(PATHS)
    query = _query(draw(QUERY), draw(st.booleans()))
    return f"{scheme}://{host}{path}" + (f"?{query}" if query or draw(st.booleans()) else "")


def _only_library_errors(parse, *args, **kwargs):
    """Call ``parse``; a TieredKVError is an answer, any other exception fails the test."""
    try:
        return parse(*args, **kwargs)
    except TieredKVError:
        return None


def _checked(options) -> None:
    """Options that parsed hold finite floats and ints within their own annotations."""
    if options is None:
        return
    for f in dataclasses.fields(options):
        value = getattr(options, f.name)
        assert not isinstance(value, float) or math.isfinite(value), (f.name, value)
        if f.name.endswith("_bytes") and value is not None:
            assert 0 <= value <= MAX_SIZE


@FUZZ
@given(urls(["redis", "rediss", "unix", "REDIS", "redis+x"]), st.dictionaries(st.sampled_from(OPTION_KEYS), VALUES, max_size=2))
def test_redis_url_parser(url, overrides):
    _checked(_only_library_errors(parse_redis_url, url, overrides))


@FUZZ
@given(urls(["mooncake", "Mooncake", "moon"]), st.dictionaries(st.sampled_from(OPTION_KEYS), VALUES, max_size=2))
def test_mooncake_url_parser(url, overrides):
    _checked(_only_library_errors(MooncakeOptions.from_url, url, overrides))


@FUZZ
@given(urls(["file", "memory", "x"]))
def test_file_and_memory_option_parsers(url):
    _checked(_only_library_errors(options_from_url, FileOptions, url, path="/tmp/tkv-fuzz"))
    _checked(_only_library_errors(options_from_url, MemoryOptions, url))
    # The file backend's own URL handling, up to building its options (the pool is not reached).
    _only_library_errors(lambda: FileBackend.from_url(url, None) if "[" in url or "\uff0f" in url else None)


@FUZZ
@given(url=st.one_of(urls(["memory", "nosuch", "ftp", "", "mem ory"]), st.text(max_size=40),
                     st.builds(lambda t: "memory://" + t, st.text(max_size=40)),
                     st.one_of(st.none(), st.integers(), st.binary(max_size=10))))
def test_open_backend_with_random_urls(url, pool):
    backend = _only_library_errors(open_backend, url, pool)
    if backend is not None:
        assert backend.scheme == "memory"
        _checked(backend.options)
        asyncio.run(backend.aclose())


@FUZZ
@given(st.one_of(NUMBERISH, SPECIAL, st.text(max_size=40), st.integers(min_value=-(2**80), max_value=2**80),
                 st.floats(allow_nan=True, allow_infinity=True), st.none(), st.booleans(), st.binary(max_size=8),
                 st.lists(st.integers(), max_size=2)))
def test_parse_size(text):
    size = _only_library_errors(parse_size, text)
    if size is not None:
        assert isinstance(size, int) and 0 <= size <= MAX_SIZE


@FUZZ
@given(st.one_of(st.text(max_size=MAX_KEY_BYTES + 20), st.text(alphabet=st.characters(max_codepoint=127), max_size=40),
                 st.binary(max_size=20), st.integers(), st.floats(), st.none(), st.lists(st.text(max_size=3), max_size=3),
                 st.just("k" * (MAX_KEY_BYTES + 1)), st.just("a\x00b"), st.just("\ud800")))
def test_check_key(key):
    got = _only_library_errors(check_key, key)
    if got is not None:
        assert got == key and 1 <= len(key) <= MAX_KEY_BYTES and key.isascii() and key.isprintable()


@pytest.fixture(scope="module")
def pool():
    with HostPool(SPEC, 2) as pool:
        yield pool
