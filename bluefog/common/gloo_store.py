"""The Gloo rendezvous store's wire protocol in Python: a server and a client.

The ranks' side is C++ (csrc/transport/gloo/tcp_store.cc); this module speaks the same protocol
so that an elastic ``bfrun --gloo`` can serve the store itself (it outlives every rank, so the
job's store survives the loss of any worker) and so that the driver and the workers can
exchange the rounds of the job (bluefog/common/elastic_rounds.py) through it. No TensorFlow.

The handshake (as csrc/transport/gloo/store_auth.h): the client sends ``BFG2``, a nonce of 16
random bytes and its rank (i32); the server answers its own nonce and its proof; the client
sends its proof; the server answers ``Y`` or ``N``. A proof is HMAC-SHA-256 keyed with the job's
token over a label (``bluefog-store-server|`` or ``bluefog-store-client|``), both nonces and the
rank (i32, little-endian): each end learns that the other holds the token, and the token never
crosses the wire. Then requests (native byte order, as the C++ side): an op byte (``S`` set,
``G`` get, ``H`` has), the key's length (u32), the key and, for a set, the value's length (u64)
and the value. A set is answered ``K``; a get ``Y``, the length (u64) and the bytes, or ``N``
while the key is unset; a has ``Y`` or ``N``.
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import os
import socket
import struct
import sys
import threading
import time
from typing import Callable, Dict, List, Optional

_MAGIC = b"BFG2"
_NONCE = 16
_MAX_KEY = 4096
_MAX_VALUE = 64 << 20
# Connections that are not a rank's must not take the server's descriptors or threads (as in
# tcp_store.cc): the whole handshake within this many seconds, at most this many waiting for
# theirs at once (a new one closes the oldest, so a rank still gets in during a flood).
HANDSHAKE_TIMEOUT_S = 10.0
MAX_UNAUTHENTICATED = 64
# accept() errors that mean "out of descriptors or memory for now", not "the socket is gone".
_OUT_OF_ROOM = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
_LOGGED_REFUSALS = 10
REFUSALS_SUMMARY_S = 60.0


def job_token(secret: str) -> str:
    """The key the ranks prove they hold for ``BLUEFOG_JOB_TOKEN=secret`` (JobToken in
    store_auth.cc)."""
    return hashlib.sha256(f"bluefog-token|{secret}".encode()).hexdigest()


def proof(token: bytes, server: bool, client_nonce: bytes, server_nonce: bytes,
          rank: int) -> bytes:
    """HandshakeProof in store_auth.cc."""
    label = b"bluefog-store-server|" if server else b"bluefog-store-client|"
    message = label + client_nonce + server_nonce + struct.pack("<i", rank)
    return hmac.new(token, message, hashlib.sha256).digest()


def _read(sock: socket.socket, n: int, deadline: Optional[float] = None) -> bytes:
    """n bytes; with a deadline (time.monotonic()), all of them by then (a peer dripping one
    byte at a time is held to the deadline of the whole read, not to a timeout per byte)."""
    chunks = []
    while n > 0:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ConnectionError("timed out")
            sock.settimeout(left)
        b = sock.recv(n)
        if not b:
            raise ConnectionError("connection closed")
        chunks.append(b)
        n -= len(b)
    return b"".join(chunks)


class StoreServer:
    """The store, served from a thread of this process at ``addr:port`` (port 0: a free one,
    then in ``self.port``). When a rank's connection ends, ``<prefix>bluefog/gone/<rank>`` is
    set, ``prefix`` being what ``gone_prefix()`` returned when it connected (the round it came
    for), as rank 0's server does: the ranks read it to name who left."""

    def __init__(self, addr: str, port: int, token: str,
                 gone_prefix: Optional[Callable[[], str]] = None):
        self.token = token.encode()
        self.gone_prefix = gone_prefix
        self.data: Dict[str, bytes] = {}
        self.lock = threading.Lock()
        self.sock = socket.create_server((addr, port), reuse_port=False, backlog=128)
        self.port = self.sock.getsockname()[1]
        self.refused = 0
        # When the last count of refusals was logged, and the count then.
        self._summarized = (time.monotonic(), _LOGGED_REFUSALS)
        self._stopping = False
        # Open connections, each with when it came and whether it presented the token.
        self._clients: Dict[socket.socket, List] = {}
        self._accepting = threading.Thread(target=self._accept, daemon=True,
                                           name="bluefog-store")
        self._accepting.start()

    def set(self, key: str, value: bytes) -> None:
        with self.lock:
            self.data[key] = bytes(value)

    def get(self, key: str) -> Optional[bytes]:
        with self.lock:
            return self.data.get(key)

    def keys(self, prefix: str) -> List[str]:
        with self.lock:
            return [k for k in self.data if k.startswith(prefix)]

    def close(self) -> None:
        self._stopping = True
        try:
            self.sock.close()
        except OSError:
            pass
        with self.lock:
            clients, self._clients = list(self._clients), {}
        for c in clients:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def open_connections(self) -> int:
        """Connections open now (tests)."""
        with self.lock:
            return len(self._clients)

    def _evict_oldest(self) -> bool:
        """Shuts down the connection waiting longest for its handshake (its thread closes it);
        False when none waits. Caller holds the lock."""
        waiting = [(since, c) for c, (since, authenticated, evicted) in self._clients.items()
                   if not authenticated and not evicted]
        if not waiting:
            return False
        oldest = min(waiting, key=lambda w: w[0])[1]
        self._clients[oldest][2] = True
        try:
            oldest.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        return True

    def _refuse(self, peer, why: str) -> None:
        """Logs a refused connection with its peer's address: the first _LOGGED_REFUSALS, then
        how many more at most once every REFUSALS_SUMMARY_S seconds (a flood is not a flood
        of the log)."""
        where = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else "an unknown address"
        with self.lock:
            self.refused += 1
            n = self.refused
            summary = (n > _LOGGED_REFUSALS and
                       time.monotonic() - self._summarized[0] >= REFUSALS_SUMMARY_S)
            if summary:
                since, self._summarized = self._summarized[1], (time.monotonic(), n)
        if n <= _LOGGED_REFUSALS:
            more = (" (further refused connections are counted, not logged)"
                    if n == _LOGGED_REFUSALS else "")
            print(f"bluefog: the elastic job's store refused a connection from {where}: "
                  f"{why}{more}", file=sys.stderr, flush=True)
        elif summary:
            print(f"bluefog: the elastic job's store refused {n - since} more connection(s), "
                  f"{n} in all, the latest from {where}: {why}", file=sys.stderr, flush=True)

    def _accept(self) -> None:
        told_full = False
        while not self._stopping:
            try:
                conn, peer = self.sock.accept()
            except OSError as e:
                if self._stopping or self.sock.fileno() < 0:
                    return
                if e.errno in _OUT_OF_ROOM:
                    # Out of descriptors: make room from a stranger's connection (never a
                    # rank's) and try again, instead of ending the store for good.
                    if not told_full:
                        print(f"bluefog: the elastic job's store cannot accept ({e.strerror}); "
                              f"closing connections that have not presented a token",
                              file=sys.stderr, flush=True)
                        told_full = True
                    with self.lock:
                        evicted = self._evict_oldest()
                    if not evicted:
                        time.sleep(0.05)
                continue
            told_full = False
            try:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                with self.lock:
                    waiting = sum(1 for _, a, e in self._clients.values() if not a and not e)
                    if waiting >= MAX_UNAUTHENTICATED:
                        self._evict_oldest()
                    self._clients[conn] = [time.monotonic(), False, False]
                threading.Thread(target=self._serve, args=(conn, peer), daemon=True).start()
            except (OSError, RuntimeError) as e:  # no thread to be had: this one is refused
                with self.lock:
                    self._clients.pop(conn, None)
                conn.close()
                self._refuse(peer, f"no thread to serve it ({e})")

    def _serve(self, conn: socket.socket, peer=None) -> None:
        rank = -1
        prefix = ""
        deadline = time.monotonic() + HANDSHAKE_TIMEOUT_S
        try:
            try:
                if _read(conn, 4, deadline) != _MAGIC:
                    raise ConnectionError("it did not open with bluefog's handshake")
                client_nonce = _read(conn, _NONCE, deadline)
                (rank,) = struct.unpack("=i", _read(conn, 4, deadline))
                server_nonce = os.urandom(_NONCE)
                conn.sendall(server_nonce + proof(self.token, True, client_nonce, server_nonce,
                                                  rank))
                theirs = _read(conn, 32, deadline)
            except (ConnectionError, OSError) as e:
                rank = -1
                with self.lock:
                    evicted = self._clients.get(conn, [0, False, False])[2]
                self._refuse(peer, (
                    f"closed to make room (more than {MAX_UNAUTHENTICATED} connections waiting "
                    f"for their handshake, or out of descriptors)" if evicted else
                    f"no complete handshake within {HANDSHAKE_TIMEOUT_S:g} s"
                    if time.monotonic() >= deadline else str(e)))
                return
            if not hmac.compare_digest(
                    theirs, proof(self.token, False, client_nonce, server_nonce, rank)):
                self._refuse(peer, "its job token differs from this job's")
                conn.sendall(b"N")
                rank = -1
                return
            # A rank: its connection stays open, idle between requests, for the whole job.
            conn.settimeout(None)
            with self.lock:
                if conn in self._clients:
                    self._clients[conn][1] = True
            conn.sendall(b"Y")
            prefix = self.gone_prefix() if self.gone_prefix else ""
            while True:
                op = _read(conn, 1)
                (n,) = struct.unpack("=I", _read(conn, 4))
                if n > _MAX_KEY or op not in (b"S", b"G", b"H"):
                    return
                key = _read(conn, n).decode("utf-8", "replace")
                if op == b"S":
                    (m,) = struct.unpack("=Q", _read(conn, 8))
                    if m > _MAX_VALUE:
                        return
                    self.set(key, _read(conn, m))
                    conn.sendall(b"K")
                    continue
                value = self.get(key)
                if value is None or op == b"H":
                    conn.sendall(b"N" if value is None else b"Y")
                    continue
                conn.sendall(b"Y" + struct.pack("=Q", len(value)) + value)
        except (ConnectionError, OSError, struct.error):
            pass
        finally:
            try:
                conn.close()
            except OSError:
                pass
            with self.lock:
                self._clients.pop(conn, None)
            if self.gone_prefix and rank >= 0 and not self._stopping:
                self.set(f"{prefix}bluefog/gone/{rank}", b"")


class StoreClient:
    """One connection to a store (rank 0's or bfrun's). Raises ConnectionError when the server
    cannot be reached within ``timeout`` seconds or refuses the token."""

    def __init__(self, addr: str, port: int, token: str, rank: int = -1, timeout: float = 30.0):
        self.where = f"{addr}:{port}"
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.sock = socket.create_connection((addr, port), timeout=timeout)
                break
            except OSError as e:
                if time.monotonic() > deadline:
                    raise ConnectionError(f"the elastic driver's store at {self.where} did not "
                                          f"answer within {timeout:g} s: {e}") from None
                time.sleep(0.1)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # The server proves it holds the token first; this process answers even a wrong
        # proof, so that the server names the mismatch in its log.
        key = token.encode()
        client_nonce = os.urandom(_NONCE)
        began = time.monotonic()
        try:
            self.sock.sendall(_MAGIC + client_nonce + struct.pack("=i", rank))
            server_nonce = _read(self.sock, _NONCE)
            server_ok = hmac.compare_digest(_read(self.sock, 32),
                                            proof(key, True, client_nonce, server_nonce, rank))
            self.sock.sendall(proof(key, False, client_nonce, server_nonce, rank))
            answer = _read(self.sock, 1)
        except OSError as e:  # ConnectionError and socket.timeout are OSErrors
            # Cut off mid-handshake: a slow link, a busy driver or a flood of connections to
            # its port, not a wrong token (the server answers that with a no).
            self.sock.close()
            waited = time.monotonic() - began
            how = (f"timed out: no answer within {waited:.1f} s" if isinstance(e, TimeoutError)
                   else f"was cut off: the store closed the connection after {waited:.1f} s "
                        f"({e})")
            raise ConnectionError(
                f"the handshake with the elastic job's store at {self.where} {how}, before the "
                f"tokens were compared. The store allows {HANDSHAKE_TIMEOUT_S:g} s for the "
                f"handshake and closes the connections waiting longest during a flood of "
                f"connections: is the link to the driver's host slow, or the driver "
                f"overloaded? The driver's log names the reason") from None
        if answer != b"Y" or not server_ok:
            self.sock.close()
            raise ConnectionError(f"the store at {self.where} refused this process's job token "
                                  "(BLUEFOG_JOB_TOKEN)")
        self.lock = threading.Lock()

    def _request(self, op: bytes, key: str, value: bytes = b"") -> bytes:
        k = key.encode()
        msg = op + struct.pack("=I", len(k)) + k
        if op == b"S":
            msg += struct.pack("=Q", len(value)) + value
        with self.lock:
            self.sock.sendall(msg)
            answer = _read(self.sock, 1)
            if op == b"G" and answer == b"Y":
                (n,) = struct.unpack("=Q", _read(self.sock, 8))
                return b"Y" + _read(self.sock, n)
            return answer

    def set(self, key: str, value: bytes) -> None:
        self._request(b"S", key, value)

    def get(self, key: str) -> Optional[bytes]:
        """The value, or None while the key is unset (no wait)."""
        answer = self._request(b"G", key)
        return answer[1:] if answer[:1] == b"Y" else None

    def has(self, key: str) -> bool:
        return self._request(b"H", key) == b"Y"

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass
