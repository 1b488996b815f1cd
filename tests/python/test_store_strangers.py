"""The elastic job's store (bluefog/common/gloo_store.py) and the strangers and slow clients it
meets: a refused connection is logged with its peer's address, a flood of them only a few
times; a client whose handshake is cut off or never answered is told that, not that its token
was refused. Plain pytest, one process, real sockets on loopback; no TensorFlow."""

import re
import socket
import time

import pytest

from bluefog.common import gloo_store

TOKEN = gloo_store.job_token("this job's secret")


@pytest.fixture
def server():
    s = gloo_store.StoreServer("127.0.0.1", 0, TOKEN)
    yield s
    s.close()


def _wait(done, seconds=10.0):
    deadline = time.monotonic() + seconds
    while not done() and time.monotonic() < deadline:
        time.sleep(0.02)
    return done()


def test_refused_connections_are_logged_with_their_address_and_rate_limited(
        server, capfd, monkeypatch):
    monkeypatch.setattr(gloo_store, "REFUSALS_SUMMARY_S", 0.5)
    ports = []
    for i in range(200):
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
            ports.append(s.getsockname()[1])
            s.sendall(b"GET / HTTP/1.1\r\n\r\n")
            try:
                s.recv(16)  # the store closes it
            except ConnectionResetError:
                pass
        if i == 100:
            time.sleep(0.6)  # a summary is due at the next refusal
    with pytest.raises(ConnectionError, match="refused this process's job token"):
        gloo_store.StoreClient("127.0.0.1", server.port, gloo_store.job_token("another job"),
                               timeout=5)
    assert _wait(lambda: server.refused == 201), server.refused
    err = capfd.readouterr().err
    logged = re.findall(r"elastic job's store refused a connection from 127\.0\.0\.1:(\d+): "
                        r"it did not open with bluefog's handshake", err)
    assert len(logged) == 10, err
    assert {int(p) for p in logged} <= set(ports), (logged, ports)
    assert "(further refused connections are counted, not logged)" in err
    summaries = re.findall(r"store refused (\d+) more connection\(s\), (\d+) in all, the latest "
                           r"from 127\.0\.0\.1:\d+", err)
    assert 1 <= len(summaries) <= 2, err  # at most one per 0.5 s: not one per connection
    assert len(err.splitlines()) <= 13, err
    # The store still serves a rank.
    client = gloo_store.StoreClient("127.0.0.1", server.port, TOKEN, rank=0, timeout=5)
    client.set("k", b"v")
    assert server.get("k") == b"v"
    client.close()


def test_a_handshake_past_the_stores_deadline_is_not_called_a_wrong_token(
        server, capfd, monkeypatch):
    # A client on a link slower than the store's deadline (here: no time at all).
    monkeypatch.setattr(gloo_store, "HANDSHAKE_TIMEOUT_S", 0.0)
    with pytest.raises(ConnectionError) as e:
        gloo_store.StoreClient("127.0.0.1", server.port, TOKEN, rank=1, timeout=5)
    what = str(e.value)
    assert (f"the handshake with the elastic job's store at 127.0.0.1:{server.port} was cut "
            f"off: the store closed the connection after") in what, what
    assert "before the tokens were compared" in what and "refused" not in what, what
    assert _wait(lambda: server.refused == 1)
    assert re.search(r"refused a connection from 127\.0\.0\.1:\d+: no complete handshake "
                     r"within 0 s", capfd.readouterr().err)


def test_a_store_that_never_answers_is_a_timeout_not_a_wrong_token():
    # A listener that never accepts: the connection is made (the kernel's backlog), the
    # handshake is never answered.
    with socket.create_server(("127.0.0.1", 0)) as silent:
        port = silent.getsockname()[1]
        started = time.monotonic()
        with pytest.raises(ConnectionError) as e:
            gloo_store.StoreClient("127.0.0.1", port, TOKEN, rank=1, timeout=1)
        assert time.monotonic() - started < 5
    what = str(e.value)
    assert f"the handshake with the elastic job's store at 127.0.0.1:{port} timed out: no " \
           f"answer within 1." in what, what
    assert "refused" not in what, what
