"""Workloads for the replay: requests as token ids, in arrival order.

Two sources, both deterministic:

- ``synthetic_chat``: multi-turn chat. ``clients`` conversations of ``rounds`` turns each share one
  system prompt; a turn's prompt is the conversation so far (system prompt, every earlier turn and
  its answer) plus the new user turn, so contexts grow by each answer. Each client's turns arrive as
  a Poisson process of rate ``rate / clients`` (the merged stream is Poisson of rate ``rate``), so
  how long a context waits for its next turn varies, and the tiers see reuse at every distance.
- ``read_trace``: JSONL in the format of Mooncake's FAST'25 traces (``timestamp`` in ms,
  ``input_length``, ``output_length``, ``hash_ids``: one id per 512-token block, equal ids meaning
  the same prefix block). A block's tokens are a pure function of its id (PCG64 seeded by it), so
  page keys chain over real token ids and equal block prefixes give equal page keys. The last block
  may be partial: only ``input_length`` tokens are used.

A ``Request`` carries its tokens lazily (``tokens()``), so a 145M-token trace is not held in memory.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...errors import ConfigError

TRACE_BLOCK_TOKENS = 512  # Mooncake's traces hash prompts in blocks of 512 tokens
VOCAB = 129_280  # DeepSeek-V3's vocabulary; any token id below it is plausible
_TOKEN_DTYPE = np.uint32


@dataclass(frozen=True)
class Request:
    """One prompt arriving at ``arrival_s`` (seconds from the workload's start)."""

    index: int
    arrival_s: float
    input_length: int
    output_length: int
    tokens: Callable[[], np.ndarray]  # the prompt's token ids (uint32), made on demand
    conversation: int = -1  # the synthetic client, -1 for traces
    block_ids: tuple[int, ...] = ()  # trace requests: the hash ids of their 512-token blocks


def _random_tokens(seed: tuple[int, ...], count: int) -> np.ndarray:
    rng = np.random.Generator(np.random.PCG64(list(seed)))
    return rng.integers(0, VOCAB, count, dtype=_TOKEN_DTYPE)


# --- synthetic multi-turn chat -------------------------------------------------------------------
@dataclass(frozen=True)
class ChatWorkload:
    """The shape of a synthetic multi-turn chat (the ``replay`` flags of the same names)."""

    clients: int = 24
    rounds: int = 5
    system_tokens: int = 2048
    turn_tokens: int = 384
    answer_tokens: int = 256
    rate: float = 8.0  # requests per second, all clients together
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("clients", "rounds"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(f"workload {name} must be an int > 0, got {value!r}")
        for name in ("system_tokens", "turn_tokens", "answer_tokens", "seed"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"workload {name} must be an int >= 0, got {value!r}")
        if self.system_tokens + self.turn_tokens == 0:
            raise ConfigError("workload: system_tokens and turn_tokens are both 0, so every prompt would be empty")
        if isinstance(self.rate, bool) or not isinstance(self.rate, (int, float)) or not 0 < self.rate < math.inf:
            raise ConfigError(f"workload rate must be a finite number > 0 (requests per second), got {self.rate!r}")


def synthetic_chat(w: ChatWorkload) -> list[Request]:
    """The requests of ``w`` in arrival order (ties broken by client, then round)."""
    rng = np.random.default_rng(w.seed)
    per_client_rate = w.rate / w.clients
    events: list[tuple[float, int, int]] = []
    for client in range(w.clients):
        gaps = rng.exponential(1.0 / per_client_rate, w.rounds)
        for rnd, t in enumerate(np.cumsum(gaps)):
            events.append((float(t), client, rnd))
    events.sort()
    system = (w.seed, 0)  # seed tuples: (workload seed, 0) system, (seed, 1, client, round, part)

    def prompt(client: int, rnd: int) -> Callable[[], np.ndarray]:
        def make() -> np.ndarray:
            parts = [_random_tokens(system, w.system_tokens)]
            for r in range(rnd):
                parts.append(_random_tokens((w.seed, 1, client, r, 0), w.turn_tokens))
                parts.append(_random_tokens((w.seed, 1, client, r, 1), w.answer_tokens))
            parts.append(_random_tokens((w.seed, 1, client, rnd, 0), w.turn_tokens))
            return np.concatenate(parts)
        return make

    out = []
    for i, (t, client, rnd) in enumerate(events):
        length = w.system_tokens + rnd * (w.turn_tokens + w.answer_tokens) + w.turn_tokens
        out.append(Request(i, t, length, w.answer_tokens, prompt(client, rnd), conversation=client))
    return out


# --- Mooncake traces -----------------------------------------------------------------------------
class BlockTokens:
    """Token ids of trace blocks: block ``id`` is ``TRACE_BLOCK_TOKENS`` ids drawn by PCG64(id),
    cached (a trace's blocks recur: that is its prefix reuse)."""

    def __init__(self, cache_blocks: int = 65_536) -> None:
        self._cache: dict[int, np.ndarray] = {}
        self._cache_blocks = cache_blocks

    def block(self, block_id: int) -> np.ndarray:
        got = self._cache.get(block_id)
        if got is None:
            got = _random_tokens((block_id,), TRACE_BLOCK_TOKENS)
            if len(self._cache) >= self._cache_blocks:
                self._cache.pop(next(iter(self._cache)))  # oldest first: a bounded cache
            self._cache[block_id] = got
        return got

    def prompt(self, block_ids: tuple[int, ...], input_length: int) -> np.ndarray:
        if not block_ids:
            return np.zeros(0, dtype=_TOKEN_DTYPE)
        return np.concatenate([self.block(b) for b in block_ids])[:input_length]


def _trace_field(record: dict, name: str, where: str) -> int:
    value = record.get(name)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or (
            isinstance(value, float) and not value.is_integer()):
        raise ConfigError(f"{where}: {name!r} must be a number >= 0, got {value!r}")
    return int(value)


def parse_trace_line(line: str, where: str) -> tuple[float, int, int, tuple[int, ...]]:
    """``(timestamp_ms, input_length, output_length, hash_ids)`` of one trace line; ConfigError
    naming ``where`` (file:line) and the reason otherwise."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{where}: not JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(record, dict):
        raise ConfigError(f"{where}: expected a JSON object, got {type(record).__name__}")
    missing = [k for k in ("timestamp", "input_length", "hash_ids") if k not in record]
    if missing:
        raise ConfigError(f"{where}: missing {', '.join(repr(k) for k in missing)}")
    ts = record["timestamp"]
    if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not math.isfinite(ts) or ts < 0:
        raise ConfigError(f"{where}: 'timestamp' must be a number of ms >= 0, got {ts!r}")
    input_length = _trace_field(record, "input_length", where)
    output_length = _trace_field(record, "output_length", where) if "output_length" in record else 0
    ids = record["hash_ids"]
    if not isinstance(ids, list) or any(isinstance(b, bool) or not isinstance(b, int) or b < 0 for b in ids):
        raise ConfigError(f"{where}: 'hash_ids' must be a list of ints >= 0, got {str(ids)[:80]}")
    blocks = -(-input_length // TRACE_BLOCK_TOKENS)
    if len(ids) != blocks:
        raise ConfigError(f"{where}: input_length {input_length} needs {blocks} hash_ids of {TRACE_BLOCK_TOKENS} "
                          f"tokens, got {len(ids)}")
    return float(ts), input_length, output_length, tuple(ids)


def read_trace(path: str | Path, *, limit: int | None = None, duration_s: float | None = None) -> list[Request]:
    """The requests of a Mooncake-format JSONL trace in arrival order.

    ``limit``: at most this many requests (the first ones). ``duration_s``: only those arriving
    within that many seconds of the first one. Blank lines are skipped; any other malformed line
    is a ConfigError naming the file and line.
    """
    path = Path(path)
    try:
        handle = path.open("r", encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"--trace {path}: cannot open ({exc.strerror or exc})") from None
    blocks = BlockTokens()
    parsed: list[tuple[float, int, int, tuple[int, ...], int]] = []
    with handle:
        try:
            for lineno, line in enumerate(handle, 1):
                if not line.strip():
                    continue
                if limit is not None and len(parsed) >= limit:
                    break
                ts, n_in, n_out, ids = parse_trace_line(line, f"{path}:{lineno}")
                parsed.append((ts, n_in, n_out, ids, lineno))
        except UnicodeDecodeError as exc:
            raise ConfigError(f"{path}: not UTF-8 text ({exc.reason})") from None
    if not parsed:
        raise ConfigError(f"--trace {path}: no requests in the file")
    parsed.sort(key=lambda p: (p[0], p[4]))  # arrival order; the file's order breaks ties
    start_ms = parsed[0][0]
    out: list[Request] = []
    for ts, n_in, n_out, ids, _ in parsed:
        arrival = (ts - start_ms) / 1000.0
        if duration_s is not None and arrival > duration_s:
            break
        out.append(Request(len(out), arrival, n_in, n_out,
                           (lambda ids=ids, n=n_in: blocks.prompt(ids, n)), block_ids=ids))
    return out


__all__ = ["BlockTokens", "ChatWorkload", "Request", "TRACE_BLOCK_TOKENS", "parse_trace_line", "read_trace",
           "synthetic_chat"]
