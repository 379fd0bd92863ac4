"""A process that contributes Mooncake store memory (a *segment*) until it is told to stop.

Mooncake keeps objects in memory that client processes contribute; pages outlive the engines only
if some process holds that memory. This is that process, for the raw ceilings of ``bench storage``,
the tests and the dev stack (docker/segment-holder, scripts/dev-stack)::

    MC_TCP_BIND_ADDRESS=127.0.0.1 python -m tiered_kv.ops.bench.segment_holder hold-segment \\
        "mooncake://127.0.0.1:50051?global_segment_bytes=4GiB"

It prints ``ready`` once the segment is mounted and runs until SIGTERM / SIGINT (or, with
``--until-stdin-closes``, the end of stdin: how ``SegmentHolder`` ends its child). Exit codes: 0
stopped, 1 the store could not be set up, 2 bad usage or URL.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import os
import subprocess
import sys
import threading
from urllib.parse import urlencode

from ...backends.mooncake import MooncakeOptions, open_store
from ...errors import BackendError, BackendUnavailableError, ConfigError

PROG = "python -m tiered_kv.ops.bench.segment_holder"


class SegmentHolder:
    """A child process contributing ``options.segment_bytes`` to the store, until ``stop``.

    ``with SegmentHolder(options): ...``. The child runs ``hold_segment``; over TCP its
    ``MC_TCP_BIND_ADDRESS`` defaults to ``options.local_hostname``.
    """

    def __init__(self, options: MooncakeOptions, *, ready_timeout_s: float = 60.0) -> None:
        if not options.contribute_segment:
            raise ConfigError("SegmentHolder: options must contribute a segment")
        self.options = options
        self.ready_timeout_s = ready_timeout_s
        self.process: subprocess.Popen[str] | None = None

    def start(self) -> "SegmentHolder":
        env = dict(os.environ)
        env.setdefault("MC_TCP_BIND_ADDRESS", self.options.local_hostname)
        self.process = subprocess.Popen(
            [sys.executable, "-m", __name__, "hold-segment", "--until-stdin-closes", options_url(self.options)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        # The child prints one line once its segment is mounted (or exits with the reason).
        ready = _read_line(self.process, self.ready_timeout_s)
        if ready != "ready":
            self.stop()
            raise BackendUnavailableError(f"mooncake: segment holder did not start (said {ready!r})")
        return self

    def stop(self, timeout_s: float = 15.0) -> None:
        if self.process is None:
            return
        process, self.process = self.process, None
        if process.poll() is None:
            process.stdin.close()  # EOF: the child unmounts its segment and exits
            try:
                process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        else:
            process.stdin.close()
        process.stdout.close()

    def __enter__(self) -> "SegmentHolder":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _read_line(process: subprocess.Popen[str], timeout_s: float) -> str:
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as runner:
        future = runner.submit(process.stdout.readline)
        try:
            return future.result(timeout=timeout_s).strip()
        except concurrent.futures.TimeoutError:
            process.kill()  # unblocks readline
            return f"nothing within {timeout_s}s"


def options_url(options: MooncakeOptions) -> str:
    """A mooncake:// URL that ``MooncakeOptions.from_url`` turns back into ``options``."""
    query = {f.name: getattr(options, f.name) for f in dataclasses.fields(options) if f.name != "master"}
    query = {k: str(v).lower() if isinstance(v, bool) else v for k, v in query.items() if v is not None}
    return f"mooncake://{options.master}?{urlencode(query)}"


def hold_segment(url: str, *, until_stdin_closes: bool = False) -> None:
    """Contribute the segment ``url`` describes until SIGTERM / SIGINT (blocking; a process's job).

    ``until_stdin_closes``: stop at end of stdin too (how ``SegmentHolder`` ends its child). Either
    way the store unmounts the segment before the process exits, so the master drops its pages now
    rather than after the client's TTL.
    """
    import signal

    options = MooncakeOptions.from_url(url)
    if not options.contribute_segment:
        raise ConfigError(f"{url}: hold-segment needs contribute_segment=true")
    store = open_store(options)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    if until_stdin_closes:
        threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    print("ready", flush=True)
    try:
        while not stop.wait(1.0):  # a timed wait lets the signal handlers run
            pass
    finally:
        store.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description="Contribute Mooncake store memory for tiered-kv.")
    sub = parser.add_subparsers(dest="command", required=True)
    hold = sub.add_parser("hold-segment", help="contribute segment memory until SIGTERM / SIGINT")
    hold.add_argument("url", help="mooncake://master:port?global_segment_bytes=...")
    hold.add_argument("--until-stdin-closes", action="store_true", help="also stop at end of stdin")
    args = parser.parse_args(argv)
    try:
        hold_segment(args.url, until_stdin_closes=args.until_stdin_closes)
    except ConfigError as exc:
        # The parent reads one line: the reason, where it waits for "ready".
        print(f"error: {exc}", flush=True)
        return 2
    except BackendError as exc:
        print(f"error: {exc}", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
