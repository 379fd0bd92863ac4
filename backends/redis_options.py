"""Typed options of the Redis backend, parsed from ``redis://``, ``rediss://`` and ``unix://`` URLs.

See ``tiered_kv.backends.redis`` for what each option does and the server settings it needs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Annotated, Any
from urllib.parse import parse_qsl, unquote

from pydantic import AfterValidator, Field

from ..errors import ConfigError
from .url_options import MAX_TTL_S, MAX_WORKERS, HostName, TimeoutSeconds, check_fields, options_from_url, split_url, url_port

_SSL_CERT_REQS = ("none", "optional", "required")  # redis-py's names for ssl.CERT_*
_MAX_DB = 2**31 - 1  # the server's `databases` setting is an int


def _check_socket_path(path: str) -> str:
    if "\0" in path:
        raise ValueError("a socket path cannot hold a NUL byte")
    return path


SocketPath = Annotated[str, AfterValidator(_check_socket_path)]


@dataclass(frozen=True)
class RedisOptions:
    """Where the server is and how to talk to it. Built by ``RedisBackend.from_url``.

    Field constraints are pydantic ``Annotated`` metadata (see ``url_options``): a TTL of nan, inf
    or a century is refused here, not at the first put.
    """

    host: HostName = "127.0.0.1"
    port: Annotated[int, Field(ge=1, le=65535)] = 6379
    path: SocketPath = ""  # unix socket path; set for unix:// URLs
    db: Annotated[int, Field(ge=0, le=_MAX_DB)] = 0
    tls: bool = False
    username: str = ""
    password: str = ""
    prefix: str = "tkv:"
    ttl_s: Annotated[float, Field(ge=0, le=MAX_TTL_S, allow_inf_nan=False)] = 0.0  # 0 = no TTL
    max_in_flight: Annotated[int, Field(ge=1, le=MAX_WORKERS)] = 8
    socket_timeout_s: TimeoutSeconds = 10.0
    connect_timeout_s: TimeoutSeconds = 5.0
    zero_copy: bool = True
    ssl_ca_certs: str = ""
    ssl_certfile: str = ""
    ssl_keyfile: str = ""
    ssl_cert_reqs: str = "required"

    def __post_init__(self) -> None:
        check_fields(self)
        if self.ssl_cert_reqs not in _SSL_CERT_REQS:
            raise ConfigError(f"redis backend: ssl_cert_reqs must be one of {', '.join(_SSL_CERT_REQS)}, got {self.ssl_cert_reqs!r}")

    def redis_py_tls(self) -> dict[str, Any]:
        """The TLS options as redis-py names them. Hostnames are checked only with ``required``
        (Python refuses CERT_NONE together with a hostname check)."""
        return dict(ssl_ca_certs=self.ssl_ca_certs or None, ssl_certfile=self.ssl_certfile or None,
                    ssl_keyfile=self.ssl_keyfile or None, ssl_cert_reqs=self.ssl_cert_reqs,
                    ssl_check_hostname=self.ssl_cert_reqs == "required")

    @property
    def address(self) -> str:
        return f"unix:{self.path}" if self.path else f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        """The server as a URL, for messages: scheme, host and port (or socket path) and db, never
        the credentials."""
        if self.path:
            return f"unix://{self.path}?db={self.db}"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'rediss' if self.tls else 'redis'}://{host}:{self.port}/{self.db}"

    @property
    def ttl_ms(self) -> int:
        """PX argument; 0 = no TTL. Rounded up, so a tiny TTL never turns into none."""
        return math.ceil(self.ttl_s * 1000)


def parse_redis_url(url: str, overrides: dict[str, Any]) -> RedisOptions:
    """``RedisOptions`` from a redis / rediss / unix URL; ConfigError naming what is wrong."""
    parts = split_url(url)
    scheme = parts.scheme.lower()
    if scheme not in ("redis", "rediss", "unix"):
        raise ConfigError(f"{url}: the redis backend serves redis://, rediss:// and unix://, not {scheme}://")
    port = url_port(parts, url)
    fixed: dict[str, Any] = {"tls": scheme == "rediss"}
    if parts.username:
        fixed["username"] = unquote(parts.username)
    if parts.password:
        fixed["password"] = unquote(parts.password)
    query_keys = {k for k, _ in parse_qsl(parts.query, keep_blank_values=True)}
    if scheme == "unix":
        if not parts.path or parts.path == "/":
            raise ConfigError(f"{url}: a unix:// URL needs the socket path, e.g. unix:///run/redis.sock")
        fixed["path"] = unquote(parts.path)
    else:
        if not parts.hostname:
            raise ConfigError(f"{url}: no host; expected {scheme}://host:port/db")
        fixed["host"] = parts.hostname
        if port is not None:
            fixed["port"] = port
        db_text = parts.path.strip("/")
        if db_text:
            if not (db_text.isascii() and db_text.isdigit() and len(db_text) <= 10):
                raise ConfigError(f"{url}: bad db {db_text!r} in the path; expected a number such as /0")
            if "db" in query_keys or "db" in overrides:
                raise ConfigError(f"{url}: db given both in the path and as an option")
            fixed["db"] = int(db_text)
    for name in ("host", "port", "path", "tls"):
        if name in query_keys or name in overrides:
            raise ConfigError(f"{url}: {name} comes from the URL itself, not from an option")
    options = options_from_url(RedisOptions, url, overrides, **fixed)
    if options.tls and options.zero_copy:
        options = replace(options, zero_copy=False)  # asyncio's socket calls do not take SSL sockets
    return options
