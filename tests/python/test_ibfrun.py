"""ibfrun, end to end: a real ipyparallel cluster whose engines are mpirun ranks, driven by the
example notebook executed headless (nbclient), and ibfrun's errors. Plain pytest (not under
mpirun); each test has its own IPython directory, so no user profile is touched."""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from bluefog.run import ibfrun_engine

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NOTEBOOK = os.path.join(REPO, "examples", "interactive_consensus.ipynb")
IBFRUN = [sys.executable, "-m", "bluefog.run.ibfrun"]
FLOOD_COUNT = int(os.environ.get("BLUEFOG_FLOOD_COUNT", "2000"))

needs_cluster = pytest.mark.skipif(
    shutil.which("mpirun") is None or any(
        __import__("importlib").util.find_spec(m) is None
        for m in ("ipyparallel", "nbclient", "ipykernel")),
    reason="needs mpirun and ipyparallel, nbclient, ipykernel (pip install -r requirements.txt)")


@pytest.fixture
def ipython_dir(tmp_path, monkeypatch):
    """A fresh IPython directory (profiles, hence clusters, live there) and a Jupyter kernel
    spec "python3" for this interpreter, used by the notebook's kernel."""
    ipdir = tmp_path / "ipython"
    kernel = tmp_path / "jupyter" / "kernels" / "python3"
    kernel.mkdir(parents=True)
    (kernel / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3", "language": "python"}))
    monkeypatch.setenv("IPYTHONDIR", str(ipdir))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")
    monkeypatch.setenv("TF_NUM_INTRAOP_THREADS", "1")
    monkeypatch.setenv("TF_NUM_INTEROP_THREADS", "1")
    yield ipdir
    _kill_leftovers(ipdir)


def _kill_leftovers(ipdir):
    """After a failed test: end whatever the state files still name (normally nothing)."""
    for state_file in ipdir.glob("profile_*/pid/ibfrun.json"):
        state = json.loads(state_file.read_text())
        pids = [state.get("launcher"), state.get("controller")]
        pids += state.get("engine_pids") or []
        pids += state.get("nanny_pids") or []
        for pid in filter(None, pids):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def ibfrun(args, timeout=180):
    return subprocess.run(IBFRUN + args, capture_output=True, text=True, timeout=timeout,
                          cwd=REPO)


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False


def test_engine_requests_its_rank_as_id():
    assert ibfrun_engine.rank_from_env({"OMPI_COMM_WORLD_RANK": "3"}) == 3
    assert ibfrun_engine.rank_from_env({"RANK": "1"}) == 1  # bfrun --gloo
    assert ibfrun_engine.rank_from_env({}) is None
    assert ibfrun_engine.engine_argv(["--profile=x"], {"RANK": "2"}) == \
        ["--profile=x", "--IPEngine.id=2"]
    assert ibfrun_engine.engine_argv(["--profile=x"], {}) == ["--profile=x"]


def test_controller_listens_beyond_localhost_only_for_other_hosts(tmp_path):
    from bluefog.run import ibfrun as ib

    def args(hosts=None, hostfile=None):
        return argparse.Namespace(hosts=hosts, hostfile=hostfile)

    assert not ib._needs_remote_controller(args())
    assert not ib._needs_remote_controller(args(hosts="localhost:2,127.0.0.1:2"))
    assert ib._needs_remote_controller(args(hosts="localhost:2,node7:2"))
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# comment\nlocalhost slots=2\n")
    assert not ib._needs_remote_controller(args(hostfile=str(hostfile)))
    hostfile.write_text("localhost slots=2\nnode7 slots=2\n")
    assert ib._needs_remote_controller(args(hostfile=str(hostfile)))


def test_missing_ipyparallel_says_what_to_install(tmp_path):
    # A Python whose ipyparallel cannot be imported (a package that fails as a missing one does).
    fake = tmp_path / "ipyparallel"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ImportError('No module named ipyparallel')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), REPO]))
    result = subprocess.run(IBFRUN + ["start", "-np", "2"], capture_output=True, text=True,
                            timeout=60, cwd=REPO, env=env)
    assert result.returncode == 1
    assert "pip install ipyparallel" in result.stderr, result.stderr


@needs_cluster
def test_stop_with_nothing_running(ipython_dir):
    result = ibfrun(["stop", "--profile", "nothing"], timeout=60)
    assert result.returncode == 1
    assert "no cluster of profile 'nothing' is running" in result.stderr


def test_usage_errors():
    result = subprocess.run(IBFRUN, capture_output=True, text=True, timeout=60, cwd=REPO)
    assert result.returncode == 2 and "ibfrun start -np N" in result.stderr
    result = subprocess.run(IBFRUN + ["start", "-np", "0"], capture_output=True, text=True,
                            timeout=60, cwd=REPO)
    assert result.returncode == 1 and "-np must be >= 1, got 0" in result.stderr


def test_console_script_if_installed():
    script = os.path.join(os.path.dirname(sys.executable), "ibfrun")
    if not os.path.exists(script):
        pytest.skip("the ibfrun console script is not installed next to this python")
    result = subprocess.run([script, "--version"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "bluefog-tf" in result.stdout, result.stderr


@needs_cluster
def test_a_cluster_that_died_is_cleaned_up(ipython_dir):
    # The state of a cluster whose processes are gone (pids of a process that has ended).
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    pid_dir = ipython_dir / "profile_dead" / "pid"
    pid_dir.mkdir(parents=True)
    (pid_dir / "ibfrun.json").write_text(json.dumps(
        {"np": 2, "controller": gone.pid, "launcher": gone.pid, "engine_pids": [gone.pid]}))
    result = ibfrun(["stop", "--profile", "dead"], timeout=60)
    assert result.returncode == 0, result.stderr
    assert "the cluster of profile 'dead' had already ended; removed its files" in result.stderr
    assert not (pid_dir / "ibfrun.json").exists()


@needs_cluster
@pytest.mark.timeout(120)
def test_engines_that_cannot_start_are_reported_and_cleaned_up(ipython_dir):
    # bfrun refuses the -x name, so the engines' job ends before any engine registers.
    result = ibfrun(["start", "-np", "2", "-x", "1BAD", "--timeout", "60"], timeout=90)
    assert result.returncode == 1, result.stdout + result.stderr
    err = result.stderr
    assert "the engines' job ended (exit status" in err, err
    assert "with 0 of 2 engines registered" in err, err
    assert "missing ranks [0, 1]" in err and "not a valid environment variable name" in err, err
    assert not list(ipython_dir.glob("profile_bluefog/pid/ibfrun.json"))
    result = ibfrun(["stop"], timeout=60)
    assert result.returncode == 1, result.stderr  # nothing left to stop


def _check_controller_is_private(ipython_dir, state, addresses=("127.0.0.1",)):
    """The controller listens on `addresses` only (loopback for a one-host cluster), with
    CurveZMQ; its connection files are its owner's alone, and its keys (HMAC, CurveZMQ) are on
    no process's command line."""
    import psutil

    security = ipython_dir / "profile_bluefog" / "security"
    assert security.stat().st_mode & 0o077 == 0, oct(security.stat().st_mode)
    for name in ("ipcontroller-client.json", "ipcontroller-engine.json"):
        assert (security / name).stat().st_mode & 0o077 == 0, name
    info = json.loads((security / "ipcontroller-client.json").read_text())
    key = info["key"]
    assert len(key) >= 16
    curve_key = info.get("curve_serverkey") or ""
    assert len(curve_key) == 40, info.keys()  # CurveZMQ is on
    controller = psutil.Process(state["controller"])
    listening = {c.laddr.ip for p in [controller, *controller.children(recursive=True)]
                 for c in p.net_connections("inet") if c.status == psutil.CONN_LISTEN}
    assert listening and listening <= set(addresses), listening
    holding = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read()
                if key.encode() in cmdline or curve_key.encode() in cmdline:
                    holding.append(pid)
        except OSError:
            pass
    assert not holding, f"the controller's keys are on the command line of {holding}"


@needs_cluster
@pytest.mark.timeout(300)
def test_notebook_runs_on_a_two_engine_cluster(ipython_dir):
    import nbformat
    from nbclient import NotebookClient

    t0 = time.monotonic()
    started = ibfrun(["start", "-np", "2", "--timeout", "120"], timeout=150)
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        assert "2 engines are up (ranks 0..1" in started.stdout
        assert "ipp.Client(profile='bluefog')" in started.stdout
        state = json.loads((ipython_dir / "profile_bluefog" / "pid" / "ibfrun.json").read_text())
        t_start = time.monotonic() - t0
        _check_controller_is_private(ipython_dir, state)

        again = ibfrun(["start", "-np", "2"], timeout=60)
        assert again.returncode == 1
        assert "a cluster of profile 'bluefog' is already running (2 engines" in again.stderr
        assert "ibfrun stop --profile bluefog" in again.stderr

        nb = nbformat.read(NOTEBOOK, as_version=4)
        NotebookClient(nb, timeout=150, kernel_name="python3",
                       resources={"metadata": {"path": REPO}}).execute()
        t_notebook = time.monotonic() - t0 - t_start
    finally:
        stopped = ibfrun(["stop"], timeout=90)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert "stopped the cluster of profile 'bluefog' (2 engines" in stopped.stdout

    # What the cells printed: the notebook's own output (streams) and the engines' (%%px
    # shows each engine's stdout as display data).
    text = "\n".join(o.get("text") or o.get("data", {}).get("text/plain", "")
                     for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "rank 0 of 2" in text and "rank 1 of 2" in text, text
    summary = json.loads(text.split("summary: ", 1)[1].splitlines()[0])
    assert summary["engines"] == 2
    assert summary["consensus_error"] < 1e-6, summary
    assert summary["loss_last"] < 0.1 * summary["loss_first"], summary
    assert summary["max_distance"] < 1e-3, summary
    # Every process of the cluster has ended, and a second stop finds nothing.
    pids = [state["controller"], state["launcher"]] + state["engine_pids"] + state["nanny_pids"]
    assert not [p for p in pids if _alive(p)], pids
    assert ibfrun(["stop"], timeout=60).returncode == 1
    print(f"ibfrun start {t_start:.1f} s, notebook {t_notebook:.1f} s")


def _controller_processes(state):
    import psutil

    controller = psutil.Process(state["controller"])
    return [controller, *controller.children(recursive=True)]


def _counts(procs):
    """Descriptors and threads of the controller's processes together."""
    return (sum(len(os.listdir(f"/proc/{p.pid}/fd")) for p in procs),
            sum(len(os.listdir(f"/proc/{p.pid}/task")) for p in procs))


def _engine_pids(ipython_dir):
    """Each engine's pid, as it answers a call through the controller."""
    import ipyparallel as ipp

    from bluefog.run import ibfrun as ib

    client = ipp.Client(str(ipython_dir / "profile_bluefog" / "security" /
                            "ipcontroller-client.json"), timeout=30)
    try:
        client.wait_for_engines(2, timeout=30)
        return [pid for pid, _ in client[:].apply_sync(ib._engine_pids)]
    finally:
        client.close()


@pytest.mark.nightly  # a flood (make flood runs it at 10,000 connections)
@needs_cluster
@pytest.mark.timeout(240)
def test_a_stranger_flood_leaves_a_two_host_clusters_controller_as_it_was(ipython_dir,
                                                                          monkeypatch):
    """A cluster with an engine on another host (a stand-in remote shell): the controller
    listens where the other host reaches it (this host's address, or every interface when its
    name resolves only to loopback), the key is on no command line, the remote engine
    registers. Then FLOOD_COUNT connections (garbage, idle, slow-drip, a stranger's handshake)
    spread over every port of the controller, while others that never let go (garbage, idle)
    wait for it to close them: it closes those within its handshake deadline (before: ZeroMQ
    took garbage for an old ZeroMQ peer, kept it for good and handed its bytes to ipyparallel;
    an idle one it kept 30 s), the engines still run calls, and the controller's descriptors
    and threads come back to within 5 of their count before."""
    import threading

    import psutil

    from bluefog.run import gloo_launch, ibfrun_controller

    sys.path.insert(0, os.path.join(REPO, "tests", "flood"))
    from stranger_flood import flood, linger

    monkeypatch.setenv("BLUEFOG_RSH_AGENT", os.path.join(REPO, "tests", "python", "fake_rsh.sh"))
    t0 = time.monotonic()
    started = ibfrun(["start", "-np", "2", "--gloo", "-H", "localhost:1,elsewhere:1",
                      "--timeout", "120"], timeout=150)
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        state = json.loads((ipython_dir / "profile_bluefog" / "pid" / "ibfrun.json").read_text())
        bound = gloo_launch.listen_address() or "0.0.0.0"
        # (and its schedulers' monitor port on loopback)
        _check_controller_is_private(ipython_dir, state, addresses=(bound, "127.0.0.1"))
        engines_log = ipython_dir / "profile_bluefog" / "log" / "ibfrun-engines.log"
        assert "FAKE_RSH elsewhere" in engines_log.read_text(), engines_log.read_text()
        procs = _controller_processes(state)
        ports = sorted({c.laddr.port for p in procs for c in p.net_connections("inet")
                        if c.status == psutil.CONN_LISTEN})
        assert len(ports) >= 5, ports
        host = "127.0.0.1" if bound == "0.0.0.0" else bound
        time.sleep(1.0)  # the client of `ibfrun start` has gone
        before = _counts(procs)
        lingered = {}
        lingering = threading.Thread(target=lambda: lingered.update(
            report=linger(host, ports, per_port=2, hold=ibfrun_controller.HANDSHAKE_S + 12)))
        t_flood = time.monotonic()
        lingering.start()
        report = flood(host, ports, FLOOD_COUNT, concurrency=200, hold=2.0)
        lingering.join()
        t_flood = time.monotonic() - t_flood
        assert _engine_pids(ipython_dir) == state["engine_pids"]
        deadline = time.monotonic() + 30
        while _counts(procs) > (before[0] + 5, before[1] + 5) and time.monotonic() < deadline:
            time.sleep(0.2)
        after = _counts(procs)
    finally:
        stopped = ibfrun(["stop"], timeout=90)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    kept = lingered["report"]
    print(f"\nibfrun controller, {len(ports)} ports: {FLOOD_COUNT} connections in "
          f"{report.seconds} s ({report.connect_failed} not connected, "
          f"{report.closed_by_server} closed by it), {kept.count} lingering: "
          f"{kept.closed_by_server} closed by it within {kept.seconds} s; descriptors, threads "
          f"{before} before, {after} after; whole test {time.monotonic() - t0:.1f} s "
          f"(flood {t_flood:.1f} s)")
    assert kept.closed_by_server == kept.count, kept
    assert report.accepted_token == 0
    assert after[0] <= before[0] + 5 and after[1] <= before[1] + 5, (before, after)
