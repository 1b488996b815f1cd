"""Rank 0's live job page: an HTML page, ``/data.json`` and ``/metrics`` (Prometheus' text
format), served by a small threaded HTTP server in daemon threads.

Training never waits for it: the training thread only appends to ``JobState`` under a short
lock; the server's threads read. Every connection has a timeout, at most ``MAX_CONNECTIONS``
are served at once (more are closed at once), one not authenticated within
``LOGIN_DEADLINE_S`` is cut, requests are GET or HEAD with bounded lines and headers, and a
handler's error ends that connection only. Every request is authenticated
(``job_page_auth``). The charts are drawn by plotly.js, served from the installed ``plotly``
Python package (the browser fetches nothing outside the job).
"""

from __future__ import annotations

import http.server
import ipaddress
import json
import math
import os
import socket
import threading
import time
import urllib.parse
from typing import Any, Callable, Dict, List, Optional, Tuple

from bluefog.common import flight_recorder
from bluefog.common.job_page_auth import DigestAuth, default_secret_path, load_or_create_secret
from bluefog.common.job_page_state import JobState, metrics_text

VARIABLE = "BLUEFOG_JOB_PAGE"
MAX_CONNECTIONS = 16
CONNECTION_TIMEOUT_S = 5.0  # per read or write
LOGIN_DEADLINE_S = 10.0  # a connection not authenticated by then is cut, however it drips
_HERE = os.path.dirname(os.path.abspath(__file__))


def parse_address(value: str, where: str = VARIABLE) -> Tuple[str, int]:
    """``"PORT"`` or ``"HOST:PORT"`` (``"[::1]:PORT"`` for IPv6) into (host, port); the host
    defaults to 127.0.0.1, port 0 picks a free one. Raises ValueError saying what is accepted."""
    text = str(value).strip()
    host, sep, port_text = text.rpartition(":")
    if not sep:
        host = "127.0.0.1"
    host = host.strip("[]")
    hint = (f"bluefog job page: {where}={value!r} is not a port or host:port (e.g. 8265, "
            f"127.0.0.1:8265, 0.0.0.0:8265; port 0 picks a free one)")
    if not port_text.isdigit() or int(port_text) > 65535 or not host:
        raise ValueError(hint)
    try:
        ipaddress.ip_address(host)
    except ValueError:
        if not all(part.isalnum() or "-" in part for part in host.split(".")):
            raise ValueError(hint) from None
    return host, int(port_text)


def _plotly_js() -> bytes:
    try:
        import plotly
    except ImportError:
        raise ImportError("bluefog job page: the charts need the `plotly` package (its "
                          "plotly.min.js); install it: pip install plotly, or bluefog-tf's "
                          "`jobpage` extra") from None
    with open(os.path.join(os.path.dirname(plotly.__file__), "package_data",
                           "plotly.min.js"), "rb") as f:
        return f.read()


def rank_stalls(stall_seconds: float) -> List[Dict[str, Any]]:
    """This rank's pending operations (oldest first), each with ``stalled`` (pending longer
    than ``stall_seconds``) and a ``diagnosis`` from its state."""
    out = []
    for e in flight_recorder.flight_recorder():
        if e["state"] not in ("queued", "running"):
            continue
        age = float(e["queued_s_ago"])
        if e["state"] == "queued":
            why = ("submitted here and waiting for the other ranks: at least one has not "
                   "submitted it (the last stall warning names them)")
        else:
            why = (f"agreed by every rank, exchanging data for {e['started_s_ago']:.1f} s: "
                   "a peer or the network is slow or gone")
        out.append({"kind": e["kind"], "name": e["name"], "state": e["state"],
                    "bytes": e["bytes"], "pending_seconds": round(age, 3),
                    "stalled": age >= stall_seconds, "diagnosis": why})
    return out


def stall_seconds() -> float:
    """BLUEFOG_STALL_CHECK_TIME as the runtime reads it (60 s by default; 0: never stalled)."""
    try:
        value = float(os.environ.get("BLUEFOG_STALL_CHECK_TIME", "60"))
    except ValueError:
        value = 60.0
    return value if value > 0 else math.inf


def topology_json(graph) -> Dict[str, Any]:
    """Nodes on a circle and weighted edges of a networkx graph (None: no topology)."""
    if graph is None:
        return {"nodes": [], "edges": []}
    nodes = sorted(graph.nodes())
    n = max(len(nodes), 1)
    pos = {v: (math.cos(2 * math.pi * i / n), math.sin(2 * math.pi * i / n))
           for i, v in enumerate(nodes)}
    return {"nodes": [{"rank": int(v), "x": pos[v][0], "y": pos[v][1]} for v in nodes],
            "edges": [{"src": int(a), "dst": int(b), "weight": float(d.get("weight", 1.0))}
                      for a, b, d in graph.edges(data=True) if a != b]}


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = False

    def __init__(self, address, handler, page: JobPage):
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.page = page
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        super().__init__(address, handler)

    def process_request(self, request, client_address):
        if not self.slots.acquire(blocking=False):
            self.shutdown_request(request)  # a flood: refuse rather than queue
            return
        try:
            super().process_request(request, client_address)
        except Exception:
            self.slots.release()
            raise

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()

    def handle_error(self, request, client_address):
        pass  # a stranger's broken connection ends that connection, quietly


class _Handler(http.server.BaseHTTPRequestHandler):
    timeout = CONNECTION_TIMEOUT_S
    server_version = "bluefog-job-page"
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def setup(self) -> None:
        super().setup()
        self._deadline = threading.Timer(LOGIN_DEADLINE_S, self._cut)
        self._deadline.daemon = True
        self._deadline.start()

    def _cut(self) -> None:
        try:
            self.request.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def finish(self) -> None:
        self._deadline.cancel()
        super().finish()

    def _send(self, code: int, body: bytes, ctype: str, headers: Dict[str, str] = None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _authorized(self) -> bool:
        page: JobPage = self.server.page
        peer = ipaddress.ip_address(self.client_address[0].split("%")[0])
        loopback = peer.is_loopback or (peer.version == 6 and peer.ipv4_mapped is not None
                                        and peer.ipv4_mapped.is_loopback)
        verdict = page.auth.check(self.headers.get("Authorization"), self.command, self.path,
                                  loopback)
        if verdict:
            self._deadline.cancel()
            return True
        self._send(401, b"bluefog job page: credentials needed (user bluefog, the secret in "
                   b"the file the job printed)\n", "text/plain; charset=utf-8",
                   {"WWW-Authenticate": page.auth.challenge(stale=verdict is None)})
        return False

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        if not self._authorized():
            return
        page: JobPage = self.server.page
        url = urllib.parse.urlsplit(self.path)
        if url.path in ("/", "/index.html"):
            self._send(200, page.html, "text/html; charset=utf-8")
        elif url.path == "/plotly.min.js":
            self._send(200, page.plotly_js(), "application/javascript")
        elif url.path == "/data.json":
            query = urllib.parse.parse_qs(url.query)
            try:
                since = float(query.get("since", ["0"])[0])
            except ValueError:
                since = 0.0
            body = json.dumps(page.data(since), allow_nan=False, default=str).encode()
            self._send(200, body, "application/json")
        elif url.path == "/metrics":
            self._send(200, page.metrics().encode(), "text/plain; version=0.0.4; charset=utf-8")
        else:
            self._send(404, b"not found\n", "text/plain; charset=utf-8")

    def _refuse(self) -> None:
        self._send(405, b"GET only\n", "text/plain; charset=utf-8", {"Allow": "GET, HEAD"})

    do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _refuse


class JobPage:
    """A listening job page. ``topology`` returns the current networkx graph (or None)."""

    def __init__(self, host: str, port: int, rank: int, secret_file: Optional[str] = None,
                 topology: Callable[[], Any] = lambda: None):
        self.state = JobState()
        self.topology = topology
        self.stall_seconds = stall_seconds()
        with open(os.path.join(_HERE, "job_page.html"), "rb") as f:
            self.html = f.read()
        self._js: Optional[bytes] = None
        _plotly_js()  # fails now, on rank 0, when plotly is missing
        try:
            self._server = _Server((host, port), _Handler, self)
        except OSError as e:
            raise OSError(e.errno, f"bluefog job page: rank {rank} cannot listen on "
                          f"{host}:{port}: {e.strerror}; choose another port (BLUEFOG_JOB_PAGE "
                          f"or bfrun --job-page)") from None
        self.host, self.port = self._server.server_address[:2]
        self.secret_file = secret_file or default_secret_path(self.port)
        try:
            self.auth = DigestAuth(load_or_create_secret(self.secret_file))
        except Exception:
            self._server.server_close()
            raise
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={"poll_interval": 0.5},
                                        name="bluefog-job-page", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/"

    def plotly_js(self) -> bytes:
        if self._js is None:
            self._js = _plotly_js()
        return self._js

    def stalls(self) -> List[Dict[str, Any]]:
        try:
            return rank_stalls(self.stall_seconds)
        except Exception:
            return []

    def data(self, since: float) -> Dict[str, Any]:
        out = self.state.snapshot(since)
        try:
            out["topology"] = topology_json(self.topology())
        except Exception:
            out["topology"] = {"nodes": [], "edges": []}
        out["rank0_pending"] = self.stalls()
        try:
            message, ago = flight_recorder.last_stall()
        except Exception:
            message, ago = "", 0.0
        out["last_stall"] = {"message": message, "seconds_ago": round(ago, 1)} if message \
            else None
        try:
            out["arrivals"] = flight_recorder.straggler_report()
        except Exception:
            out["arrivals"] = None
        out["stall_seconds"] = None if math.isinf(self.stall_seconds) else self.stall_seconds
        out["now"] = time.time()
        return out

    def metrics(self) -> str:
        return metrics_text(self.state, self.stalls)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
