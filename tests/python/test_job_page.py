"""The live job page (docs/job-page.md) of a real 2-rank job under mpirun: rank 0 serves it,
authenticated (Digest; a bearer token only from loopback), and strangers (garbage, a half
request, a flood of idle connections) neither break it nor stop training. /metrics is valid
Prometheus text with every rank's step time and names the slowed rank as the straggler; the
page renders its plotly charts in headless chromium (Playwright, as test_site_browser.py);
JobPageCallback writes TensorBoard scalars; a busy port and bad addresses give clear errors.
One job for all of it (TensorFlow's import is the cost)."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from bluefog.common import job_page
from bluefog.common.job_page import parse_address

from mpi_jobs import PYTHON, REPO, BackgroundJob, have_mpirun, mpirun_prefix
from test_site_browser import _chromium, _unavailable

pytestmark = pytest.mark.timeout(150)
HERE = os.path.dirname(os.path.abspath(__file__))
# One sample line: name, optional labels, a value (Prometheus text format 0.0.4).
SAMPLE = re.compile(r'^[a-zA-Z_:][a-zA-Z0-9_:]*(\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\]|\\.)*",?)*\})?'
                    r' (-?[0-9.eE+-]+|NaN|[+-]Inf)$')


def test_addresses_are_parsed_or_refused_clearly():
    assert parse_address("8265") == ("127.0.0.1", 8265)
    assert parse_address("0.0.0.0:80") == ("0.0.0.0", 80)
    assert parse_address("[::1]:0") == ("::1", 0)
    for bad in ("", "x", "65536", "-1", ":", "host:port", "a b:1"):
        with pytest.raises(ValueError, match="is not a port or host:port"):
            parse_address(bad)
    out = subprocess.run([sys.executable, "-m", "bluefog.run", "--job-page", "80a", "-np", "2",
                          "true"], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert out.returncode == 2 and "--job-page='80a' is not a port" in out.stderr, out.stderr
    if have_mpirun():  # the variable reaches the ranks
        out = subprocess.run([sys.executable, "-m", "bluefog.run", "--job-page", "8265", "-np",
                              "2", "--dry-run", "true"], capture_output=True, text=True,
                             cwd=REPO, timeout=60)
        assert out.returncode == 0 and " -x BLUEFOG_JOB_PAGE " in out.stderr, out.stderr


def test_a_dripping_stranger_is_cut_and_bad_credentials_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(job_page, "LOGIN_DEADLINE_S", 1.0)
    page = job_page.JobPage("127.0.0.1", 0, 0, str(tmp_path / "secret"))
    try:
        s = socket.create_connection(("127.0.0.1", page.port), timeout=10)
        started, closed = time.time(), False
        for _ in range(8):  # one byte every 0.5 s: within the per-read timeout
            try:
                s.sendall(b"G")
                time.sleep(0.5)
            except OSError:
                closed = True
                break
        s.settimeout(3)
        closed = closed or s.recv(100) == b""
        assert closed and time.time() - started < 4.5
        secret = open(tmp_path / "secret").read().strip()
        code, text, _ = _get(page.url + "metrics", {"Authorization": f"Bearer {secret}"})
        assert code == 200 and "bluefog_straggler -1" in text
        for bad in ('Digest username="bluefog", realm="x", nonce="1-\xe9", uri="/metrics", '
                    'response="\xe9", nc=1, cnonce=x, qop=auth', "Digest " + "a=b," * 3000,
                    "Bearer \xe9", "Basic Ymx1ZWZvZzp4", "Digest garbage"):
            assert _get(page.url + "metrics", {"Authorization": bad})[0] == 401, bad
    finally:
        page.close()


def _get(url: str, headers=None, opener=None):
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with (opener or urllib.request.urlopen)(request, timeout=10) as r:
            return r.status, r.read().decode(), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(), dict(e.headers)


def _digest(url: str, password: str):
    handler = urllib.request.HTTPDigestAuthHandler()
    handler.add_password("bluefog job page", url, "bluefog", password)
    return urllib.request.build_opener(handler).open


def _metrics(base: str, secret: str) -> dict:
    code, text, headers = _get(base + "metrics", {"Authorization": f"Bearer {secret}"})
    assert code == 200 and headers["Content-Type"].startswith("text/plain; version=0.0.4")
    values = {}
    for line in text.splitlines():
        if line.startswith("# "):
            assert re.match(r"^# (HELP|TYPE) [a-zA-Z_:][a-zA-Z0-9_:]* \S", line), line
            continue
        assert SAMPLE.match(line), line
        name, value = line.rsplit(" ", 1)
        values[name] = float(value)
    return values


def _wait_metrics(base: str, secret: str, ready, timeout: float = 60) -> dict:
    """/metrics once ``ready(values)``; connections refused meanwhile (a flood) are retried."""
    deadline, values = time.time() + timeout, {}
    while time.time() < deadline:
        try:
            values = _metrics(base, secret)
        except OSError:
            values = {}
        if ready(values):
            return values
        time.sleep(0.5)
    raise AssertionError(f"/metrics never got there: {values}")


def _wait_data(base: str, secret: str, ready, timeout: float = 20) -> dict:
    deadline, data = time.time() + timeout, {}
    while time.time() < deadline:
        code, text, _ = _get(base + "data.json", {"Authorization": f"Bearer {secret}"})
        data = json.loads(text) if code == 200 else {}
        if data and ready(data):
            return data
        time.sleep(0.2)
    raise AssertionError(f"/data.json never got there: {data}")


def _strangers(port: int) -> list:
    held = []
    for payload in (b"\x00\xff garbage \r\n\r\n", b"GET / HTTP/1.1\r\nHost: x", b"",
                    b"POST /metrics HTTP/1.1\r\nContent-Length: 99999999\r\n\r\n",
                    b"GET /" + b"a" * 70000 + b" HTTP/1.1\r\n\r\n"):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.sendall(payload)
        held.append(s)
    for _ in range(40):  # a flood of idle connections, more than the server serves at once
        held.append(socket.create_connection(("127.0.0.1", port), timeout=5))
    return held


def test_job_page_in_a_real_job(tmp_path):
    if not have_mpirun():
        pytest.skip("mpirun not installed")
    stop = tmp_path / "stop"
    env = {"BLUEFOG_JOB_PAGE": "127.0.0.1:0", "XDG_RUNTIME_DIR": str(tmp_path),
           "BLUEFOG_STALL_CHECK_TIME": "1",
           "TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1"}
    job = BackgroundJob(mpirun_prefix(2) + [PYTHON, os.path.join(HERE, "job_page_job.py"),
                                            str(stop), str(tmp_path / "tb")], env=env)
    try:
        found = job.wait_for(r"bluefog job page: (http://127\.0\.0\.1:(\d+)/) \(user bluefog, "
                             r"secret in (\S+)\)", timeout=90)
        base, port, secret_file = found.group(1), int(found.group(2)), found.group(3)
        assert oct(os.stat(secret_file).st_mode & 0o777) == "0o600"
        secret = open(secret_file).read().strip()

        code, _, headers = _get(base)
        assert code == 401 and headers["WWW-Authenticate"].startswith("Digest ")
        assert _get(base + "metrics", {"Authorization": "Bearer wrong-secret-value"})[0] == 401
        assert _get(base, opener=_digest(base, "wrong"))[0] == 401
        code, html, _ = _get(base, opener=_digest(base, secret))
        assert code == 200 and "plotly.min.js" in html

        before = _wait_metrics(base, secret, lambda v: 'bluefog_steps_total{rank="0"}' in v)
        held = _strangers(port)  # the server refuses what it cannot take; training goes on
        time.sleep(1)
        for s in held:
            s.close()
        values = _wait_metrics(base, secret, lambda v: v.get("bluefog_straggler") == 1)
        steps = values['bluefog_steps_total{rank="0"}']
        assert steps > before['bluefog_steps_total{rank="0"}']
        assert values["bluefog_ranks"] == 2
        for r in (0, 1):
            assert values[f'bluefog_step_seconds{{rank="{r}"}}'] > 0.03
            assert values[f'bluefog_sent_bytes_total{{rank="{r}"}}'] > 0

        _browser(base, secret, tmp_path)
        assert _metrics(base, secret)['bluefog_steps_total{rank="0"}'] > steps  # still training
        (tmp_path / "stop.stall").write_text("stall")
        stall = _wait_data(base, secret, lambda d: d["last_stall"] and "'grad'" in
                           d["last_stall"]["message"] and any(
                               p["name"] == "grad" and p["stalled"] for p in d["rank0_pending"]))
        pending = [p for p in stall["rank0_pending"] if p["name"] == "grad"][0]
        assert pending["state"] == "queued" and "waiting for the other ranks" in \
            pending["diagnosis"], pending
        # Rank 1 has not reached its next collective: the hang doctor's diagnosis says so.
        assert re.search(r"^rank 0: hang doctor: allreduce 'grad' has waited .*\n  rank 1 has "
                         r"not called allreduce 'grad' again; it is in no bluefog operation",
                         stall["last_stall"]["message"]), stall["last_stall"]
    finally:
        stop.write_text("stop")
        output = job.finish(timeout=60)
    assert job.proc.returncode == 0, output[-6000:]
    assert secret not in output
    for r in (0, 1):
        assert f"rank {r} done after" in output
        assert re.search(rf"rank {r} refused 'abc': bluefog job page: address='abc' is not a "
                         "port", output), output[-3000:]
    assert re.search(r"busy port refused: .*bluefog job page: rank 0 cannot listen on "
                     r"127\.0\.0\.1:\d+: .*choose another port", output), output[-3000:]
    tags = re.search(r"tensorboard tags: (.*)", output).group(1).split()
    assert {"bluefog/step_seconds/rank0", "bluefog/step_seconds/rank1",
            "bluefog/bytes_per_second/rank1", "bluefog/straggler"} <= set(tags), tags


def _browser(base: str, secret: str, tmp_path) -> None:
    executable = _chromium()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("the playwright package is missing: `make deps` installs requirements.txt")
    errors = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, headless=True,
                                    args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page(http_credentials={"username": "bluefog", "password": secret},
                                    viewport={"width": 1200, "height": 900})
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("requestfailed", lambda r: errors.append(f"failed: {r.url}"))
            page.goto(base, wait_until="load")
            page.wait_for_function("document.querySelectorAll('#steptime .scatterlayer .trace')"
                                   ".length === 2", timeout=20000)
            assert page.locator("#bytes .scatterlayer .trace").count() == 2
            assert page.locator("#topology .scatterlayer .point").count() == 2
            assert page.locator("#ranks tbody tr").count() == 2
            page.wait_for_function("document.getElementById('straggler').textContent"
                                   ".includes('rank 1')", timeout=20000)
            assert "straggler" in page.locator("#ranks tbody tr").nth(1).get_attribute("class")
            # The runtime's arrival lags: rank 1, slowed, comes later to the collectives.
            cells = [[page.locator("#ranks tbody tr").nth(r).locator("td").nth(c).text_content()
                      for c in (7, 8)] for r in range(2)]
            assert float(cells[1][0]) > float(cells[0][0]), cells
            assert int(cells[1][1].split(" / ")[0]) > 0, cells
            if os.environ.get("BLUEFOG_JOB_PAGE_SCREENSHOT"):
                page.screenshot(path=os.environ["BLUEFOG_JOB_PAGE_SCREENSHOT"], full_page=True)
        finally:
            browser.close()
    assert not errors, errors
