"""A stranger's flood against a listener: connections that are not a job's, by the thousand.

    python tests/flood/stranger_flood.py HOST PORT --count 10000 [--pid PID]

Four kinds, in turn: *garbage* (random bytes, then wait for the close), *idle* (connect, say
nothing), *slow-drip* (the store's opening, one byte every 300 ms) and *wrong-token* (the whole
handshake with a key that is not the job's: the store must answer ``N``). At most
``--concurrency`` are open at once; an idle or dripping one lets go after ``--hold`` seconds
if the server has not closed it first. With ``--pid``, the listener process's descriptor and
thread counts (/proc/PID/fd, /proc/PID/task) are read before, at the peak, and once they are
back within 5 of where they started (or after ``--settle`` seconds).

Used by tests/python/test_flood.py; ``make flood`` runs it at 10,000 connections.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import struct
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Dict, Optional, Sequence, Tuple, Union

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

from bluefog.common import gloo_store  # noqa: E402

KINDS = ("garbage", "idle", "drip", "wrong-token")


@dataclass
class Report:
    count: int = 0
    seconds: float = 0.0
    kinds: Dict[str, int] = field(default_factory=dict)
    connect_failed: int = 0
    refused_token: int = 0   # wrong-token connections answered "N" (or closed)
    accepted_token: int = 0  # wrong-token connections answered "Y": must stay 0
    closed_by_server: int = 0
    fds: Tuple[int, int, int] = (0, 0, 0)      # before, peak, after
    threads: Tuple[int, int, int] = (0, 0, 0)  # before, peak, after


def counts(pid: int) -> Tuple[int, int]:
    """(descriptors, threads) of process `pid`."""
    return len(os.listdir(f"/proc/{pid}/fd")), len(os.listdir(f"/proc/{pid}/task"))


async def _closed_within(reader: asyncio.StreamReader, seconds: float) -> bool:
    """Reads until the server closes (True) or `seconds` pass (False)."""
    deadline = time.monotonic() + seconds
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if not await asyncio.wait_for(reader.read(4096), left):
                return True
    except asyncio.TimeoutError:  # before OSError: TimeoutError is one
        return False
    except OSError:  # reset by the server
        return True


async def _one(kind: str, host: str, port: int, hold: float, report: Report) -> None:
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 10)
    except (OSError, asyncio.TimeoutError):
        report.connect_failed += 1
        return
    closed = False
    try:
        if kind == "garbage":
            writer.write(os.urandom(64 + int.from_bytes(os.urandom(2), "little") % 4000))
            await writer.drain()
            closed = await _closed_within(reader, hold)
        elif kind == "idle":
            closed = await _closed_within(reader, hold)
        elif kind == "drip":
            hello = b"BFG2" + os.urandom(16) + struct.pack("=i", 0)
            deadline = time.monotonic() + hold
            for b in hello:
                writer.write(bytes([b]))
                await writer.drain()
                if await _closed_within(reader, min(0.3, max(0.0, deadline - time.monotonic()))):
                    closed = True
                    break
                if time.monotonic() >= deadline:
                    break
        else:  # wrong-token
            key = gloo_store.job_token("not this job's " + os.urandom(8).hex()).encode()
            nonce = os.urandom(16)
            writer.write(b"BFG2" + nonce + struct.pack("=i", 1))
            await writer.drain()
            theirs = await asyncio.wait_for(reader.readexactly(48), 10)
            writer.write(gloo_store.proof(key, False, nonce, theirs[:16], 1))
            await writer.drain()
            answer = await asyncio.wait_for(reader.read(1), 10)
            if answer == b"Y":
                report.accepted_token += 1
            else:
                report.refused_token += 1
            closed = await _closed_within(reader, hold)
    except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError):
        closed = True
        if kind == "wrong-token":
            report.refused_token += 1
    finally:
        report.closed_by_server += closed
        writer.close()
        try:
            await writer.wait_closed()
        except OSError:
            pass


async def _flood(host: str, port: Union[int, Sequence[int]], count: int, concurrency: int,
                 hold: float, pid: Optional[int], report: Report) -> None:
    ports = [port] if isinstance(port, int) else list(port)
    room = asyncio.Semaphore(concurrency)
    peak = [0, 0]

    async def watch():
        while True:
            if pid:
                f, t = counts(pid)
                peak[0], peak[1] = max(peak[0], f), max(peak[1], t)
            await asyncio.sleep(0.2)

    async def one(i):
        try:
            await _one(KINDS[i % len(KINDS)], host, ports[i % len(ports)], hold, report)
        finally:
            room.release()

    watcher = asyncio.ensure_future(watch())
    tasks = []
    for i in range(count):
        await room.acquire()
        report.kinds[KINDS[i % len(KINDS)]] = report.kinds.get(KINDS[i % len(KINDS)], 0) + 1
        tasks.append(asyncio.ensure_future(one(i)))
    await asyncio.gather(*tasks)
    watcher.cancel()
    report.fds = (0, peak[0], 0)
    report.threads = (0, peak[1], 0)


def flood(host: str, port: Union[int, Sequence[int]], count: int, concurrency: int = 200,
          hold: float = 2.0, pid: Optional[int] = None, settle: float = 30.0) -> Report:
    """Runs the flood (against several ports in turn when `port` is a list of them); returns
    what it saw (see Report)."""
    report = Report(count=count)
    before = counts(pid) if pid else (0, 0)
    started = time.monotonic()
    asyncio.run(_flood(host, port, count, concurrency, hold, pid, report))
    report.seconds = round(time.monotonic() - started, 1)
    if pid:
        deadline = time.monotonic() + settle
        after = counts(pid)
        while (after[0] > before[0] + 5 or after[1] > before[1] + 5) and \
                time.monotonic() < deadline:
            time.sleep(0.2)
            after = counts(pid)
        report.fds = (before[0], max(report.fds[1], before[0]), after[0])
        report.threads = (before[1], max(report.threads[1], before[1]), after[1])
    return report


def linger(host: str, ports: Sequence[int], per_port: int, hold: float,
           kinds: Sequence[str] = ("garbage", "idle")) -> Report:
    """`per_port` connections of each of `kinds` to each port that never let go themselves
    before `hold` seconds: report.closed_by_server says how many the server closed first."""
    report = Report(count=len(ports) * len(kinds) * per_port)
    started = time.monotonic()

    async def run():
        await asyncio.gather(*[_one(k, host, p, hold, report)
                               for p in ports for k in kinds for _ in range(per_port)])

    asyncio.run(run())
    report.seconds = round(time.monotonic() - started, 1)
    return report


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("host")
    p.add_argument("port", type=int)
    p.add_argument("--count", type=int, default=10000)
    p.add_argument("--concurrency", type=int, default=200)
    p.add_argument("--hold", type=float, default=2.0)
    p.add_argument("--pid", type=int)
    p.add_argument("--settle", type=float, default=30.0)
    a = p.parse_args()
    report = flood(a.host, a.port, a.count, a.concurrency, a.hold, a.pid, a.settle)
    print(json.dumps(asdict(report)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
