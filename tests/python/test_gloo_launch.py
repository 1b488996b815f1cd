"""Launching Gloo jobs without mpirun: ``bfrun --gloo`` (bluefog/run/gloo_launch.py);
``bluefog.run`` is tests/python/test_run_function.py.

Real processes, real TensorFlow and Gloo; every job has a timeout. mpirun is kept off PATH for
bfrun --gloo (a PATH of a folder with only sh, env, cat and kill), so the job cannot use it.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import cloudpickle
import pytest

import bluefog
from bluefog.run import gloo_launch

from gloo_jobs import gloo_built, no_mpi_launcher_env, run_gloo_job
from mpi_jobs import (
    PYTHON,
    REPO,
    alive,
    have_mpirun,
    job_env,
    mpirun_prefix,
    netns_skip_reason,
    run_job,
)

needs_gloo = pytest.mark.skipif(not gloo_built(),
                                reason="bluefog was built without Gloo (libgloo-dev)")
JOB_TIMEOUT_S = 240
# A job's own timeout fires before pytest-timeout's: a hang fails its test with the output.
pytestmark = pytest.mark.timeout(JOB_TIMEOUT_S + 60)
# The functions below are not importable on the ranks (this file is not a package module):
# they travel by value, as a script's own functions do.
cloudpickle.register_pickle_by_value(sys.modules[__name__])
FAKE_RSH = os.path.join(REPO, "tests", "python", "fake_rsh.sh")


@pytest.fixture
def no_mpirun_env(tmp_path):
    """The environment of a bfrun --gloo run whose PATH has no mpirun."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("sh", "env", "cat", "kill", "sleep", "setsid"):
        if shutil.which(tool):
            os.symlink(shutil.which(tool), bin_dir / tool)
    env = job_env({"PATH": str(bin_dir), "BLUEFOG_GLOO_TIMEOUT": "60",
                   "TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1"})
    env = {k: v for k, v in env.items() if not k.startswith(("OMPI_", "PMIX_", "PMI_"))}
    assert shutil.which("mpirun", path=env["PATH"]) is None
    return env


def bfrun(args, env, timeout=JOB_TIMEOUT_S):
    return run_job([PYTHON, "-m", "bluefog.run", "--gloo", *args], timeout=timeout, env=env)


def _script(tmp_path, body: str) -> str:
    path = tmp_path / "job.py"
    path.write_text(textwrap.dedent(body))
    return str(path)


# --- pure ----------------------------------------------------------------------------------

def test_plan_fills_hosts_in_order():
    ranks = gloo_launch.plan(5, "a:2,b:3")
    assert [(r.rank, r.host, r.local_rank, r.local_size) for r in ranks] == [
        (0, "a", 0, 2), (1, "a", 1, 2), (2, "b", 0, 3), (3, "b", 1, 3), (4, "b", 2, 3)]
    assert [r.host for r in gloo_launch.plan(2, None)] == ["localhost"] * 2
    with pytest.raises(ValueError, match="-np 4 is more than the 3 slots"):
        gloo_launch.plan(4, "a:1,b:2")
    with pytest.raises(ValueError, match="listed twice"):
        gloo_launch.plan(2, "a:1,a:1")


def test_listen_address_is_this_hosts_own_or_every_interface():
    """Where a listener for other hosts binds: the address of this host's name, never a
    loopback one (other hosts could not reach it); "" (every interface) when that is all the
    name resolves to."""
    import ipaddress

    addr = gloo_launch.listen_address()
    assert addr == "" or not ipaddress.ip_address(addr).is_loopback, addr


def test_bfrun_gloo_dry_run_and_bad_args(no_mpirun_env):
    result = bfrun(["-np", "2", "--dry-run", "python", "x.py"], no_mpirun_env, timeout=60)
    assert result.returncode == 0, result.tail()
    assert "rank 1 on localhost (local 1 of 2), rendezvous 127.0.0.1:" in result.output
    result = bfrun(["-np", "3", "-H", "a:1", "python", "x.py"], no_mpirun_env, timeout=60)
    assert result.returncode == 2 and "more than the 1 slots" in result.output, result.tail()
    result = bfrun(["-np", "2", "/nonexistent/train"], no_mpirun_env, timeout=60)
    assert result.returncode == 127, result.tail()
    assert "cannot start rank 0 on localhost: /nonexistent/train: No such file" in result.output


# --- bfrun --gloo: processes, output, failures, signals -------------------------------------

def test_bfrun_gloo_rsh_agent_and_env(tmp_path, no_mpirun_env):
    """-H this host and a 'remote' one reached through --rsh-agent (a local stand-in for ssh):
    each rank gets its rank, local rank and size, the shared rendezvous and the job's token;
    output comes back tagged by rank."""
    job = _script(tmp_path, """
        import os
        keys = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                "MASTER_PORT", "BLUEFOG_BACKEND"]
        print("ENV", *[os.environ[k] for k in keys], len(os.environ["BLUEFOG_JOB_TOKEN"]))
        """)
    here = gloo_launch.socket.gethostname()
    result = bfrun(["-np", "3", "-H", f"{here}:2,elsewhere:1", "--rsh-agent", FAKE_RSH,
                    PYTHON, job], no_mpirun_env, timeout=60)
    assert result.returncode == 0, result.tail()
    lines = sorted(re.findall(r"^\[(\d)\]<stdout>:ENV (.*)$", result.output, re.M))
    assert [r for r, _ in lines] == ["0", "1", "2"], result.output
    fields = [line.split() for _, line in lines]
    assert [f[:4] for f in fields] == [["0", "3", "0", "2"], ["1", "3", "1", "2"],
                                       ["2", "3", "0", "1"]]
    assert len({(f[4], f[5]) for f in fields}) == 1 and fields[0][6] == "gloo"
    assert fields[0][7] == "32"
    assert "FAKE_RSH elsewhere" in result.output  # rank 2 went through the agent


def _cmdlines_holding(needles):
    """The pids whose /proc/PID/cmdline holds any of `needles` (what every local user reads)."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        if any(n.encode() in cmdline for n in needles):
            found.append((int(pid), cmdline.replace(b"\0", b" ")[:200]))
    return found


@pytest.mark.parametrize("elastic", [[], ["--min-np", "2"]], ids=["fixed", "elastic"])
def test_bfrun_gloo_remote_rank_secrets_not_on_any_command_line(tmp_path, no_mpirun_env,
                                                                 elastic):
    """A 2-"host" job, fixed or in-place elastic: while it runs, no process's command line
    holds the job token or a forwarded variable's value; the remote rank still gets both, byte
    for byte. The stand-in remote shell lives for the whole job with its arguments, as ssh
    does."""
    secret_hex = os.urandom(12).hex()
    secret = f"{secret_hex} it's \"odd\"\n$HOME \\x %s é"
    job = _script(tmp_path, f"""
        import os, time
        me = os.environ.get("BLUEFOG_ELASTIC_WORKER") or os.environ["RANK"]
        out = {str(tmp_path)!r} + "/rank" + me
        with open(out + ".tmp", "w") as f:
            f.write(os.environ["BLUEFOG_JOB_TOKEN"] + "\\0" + os.environ.get("MY_API_SECRET", ""))
        os.rename(out + ".tmp", out)
        deadline = time.time() + 60
        while not os.path.exists({str(tmp_path)!r} + "/done") and time.time() < deadline:
            time.sleep(0.05)
        """)
    proc = subprocess.Popen([PYTHON, "-m", "bluefog.run", "--gloo", "-np", "2", *elastic,
                             "-H", "localhost:1,elsewhere:1", "--rsh-agent", FAKE_RSH,
                             "-x", "MY_API_SECRET", PYTHON, job],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env={**no_mpirun_env, "MY_API_SECRET": secret,
                                 "FAKE_RSH_SESSION": "1"})
    try:
        deadline = time.time() + 60
        seen = []
        while time.time() < deadline and proc.poll() is None:
            files = [tmp_path / f"rank{r}" for r in (0, 1)]
            done = all(f.exists() for f in files)
            tokens = {f.read_text().split("\0")[0] for f in files if f.exists()}
            seen += _cmdlines_holding([secret_hex, *tokens])
            if done:
                break
            time.sleep(0.02)
        (tmp_path / "done").write_text("")
        out = proc.communicate(timeout=60)[0].decode(errors="replace")
    finally:
        proc.kill()
    assert proc.returncode == 0, out
    token0, _ = (tmp_path / "rank0").read_text().split("\0")
    token1, got = (tmp_path / "rank1").read_text().split("\0")
    assert token0 == token1 and len(token0) == 32
    assert got == secret
    assert "FAKE_RSH elsewhere" in out
    assert not seen, f"secrets on command lines: {seen}"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_bfrun_gloo_signal_ends_every_rank(tmp_path, no_mpirun_env, sig):
    job = _script(tmp_path, """
        import os, time
        print("PID", os.getpid(), flush=True)
        time.sleep(300)
        """)
    proc = subprocess.Popen([PYTHON, "-m", "bluefog.run", "--gloo", "-np", "2", "-H",
                             "localhost:1,elsewhere:1", "--rsh-agent", FAKE_RSH, PYTHON, job],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=no_mpirun_env)
    pids = []
    deadline = time.time() + 60
    while len(pids) < 2 and time.time() < deadline:
        line = proc.stdout.readline()
        found = re.search(r"PID (\d+)", line)
        if found:
            pids.append(int(found.group(1)))
    try:
        assert len(pids) == 2, "the ranks did not start"
        proc.send_signal(sig)
        rest = proc.communicate(timeout=30)[0]
    finally:
        proc.kill()
    assert proc.returncode == 128 + sig
    assert f"{signal.Signals(sig).name}: ending all 2 ranks" in rest
    deadline = time.time() + 10
    while any(alive(p) for p in pids) and time.time() < deadline:
        time.sleep(0.1)
    assert not any(alive(p) for p in pids), "a rank outlived bfrun"


@pytest.mark.parametrize("mode", ["plain", "elastic", "remote"])
def test_bfrun_gloo_sigkilled_ends_ranks_under_a_wrapper_script(tmp_path, no_mpirun_env, mode):
    """bfrun --gloo ./train.sh, the script starting Python as a child (no exec): SIGKILL of bfrun
    reaches the script alone (PDEATHSIG), yet the ranks' Python processes end too; also on a
    "remote" host (a stand-in for ssh that, as sshd, runs the rank in a session of its own)."""
    if mode == "remote" and not shutil.which("setsid"):
        pytest.skip("needs setsid (util-linux)")
    job = _script(tmp_path, """
        import os, time
        print("PID", os.getpid(), flush=True)
        time.sleep(300)
        """)
    wrapper = tmp_path / "train.sh"
    wrapper.write_text(f"#!/bin/sh\n{PYTHON} {job}\necho after\n")
    wrapper.chmod(0o755)
    extra = {"plain": [], "elastic": ["--min-np", "1", "-H", "localhost:2"],
             "remote": ["-H", "localhost:1,elsewhere:1", "--rsh-agent", FAKE_RSH]}[mode]
    proc = subprocess.Popen([PYTHON, "-m", "bluefog.run", "--gloo", "-np", "2", *extra,
                             str(wrapper)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env={**no_mpirun_env, "FAKE_RSH_SESSION": "1"},
                            start_new_session=True)
    pids = []
    deadline = time.time() + 60
    try:
        while len(pids) < 2 and time.time() < deadline:
            found = re.search(r"PID (\d+)", proc.stdout.readline())
            if found:
                pids.append(int(found.group(1)))
        assert len(pids) == 2, "the ranks did not start"
        proc.kill()
        proc.wait(timeout=10)
        deadline = time.time() + 15
        while any(alive(p) for p in pids) and time.time() < deadline:
            time.sleep(0.1)
        left = [p for p in pids if alive(p)]
    finally:
        proc.kill()
        for p in pids:
            if alive(p):
                os.kill(p, signal.SIGKILL)
    assert not left, f"rank process(es) {left} outlived a SIGKILLed bfrun"


@needs_gloo
def test_bfrun_gloo_three_ranks_and_a_failing_rank(tmp_path, no_mpirun_env):
    """3 ranks allreduce; then rank 2 dies (exit status 3, without shutting bluefog down) while
    the others wait in an allreduce for it: bfrun ends them (not after BLUEFOG_GLOO_TIMEOUT)
    and exits 3 naming rank 2. The timeline asked for is one file of the three ranks, valid
    JSON although no rank shut down."""
    job = _script(tmp_path, """
        import os
        import tensorflow as tf
        import bluefog.tensorflow as bf
        bf.init()
        x = bf.allreduce(tf.constant([float(bf.rank() + 1)] * 4), average=False)
        print("SUM", bf.backend(), bf.size(), bf.local_size(), x.numpy().tolist(), flush=True)
        if bf.rank() == 2:
            os._exit(3)
        bf.allreduce(tf.constant([1.0]), name="never_completes")
        print("NOT REACHED")
        """)
    timeline = tmp_path / "timeline.json"
    result = bfrun(["-np", "3", "--timeline-filename", str(timeline), PYTHON, job],
                   no_mpirun_env)
    assert not result.timed_out, result.tail()
    assert result.output.count("SUM gloo 3 3 [6.0, 6.0, 6.0, 6.0]") == 3, result.tail()
    assert not list(tmp_path.glob("timeline.rank*.json"))
    events = json.loads(timeline.read_text())
    assert {e["pid"] for e in events if e.get("name") == "process_name"} == {0, 1, 2}
    done = {e["pid"] for e in events if e.get("name") == "allreduce" and e["ph"] == "X"}
    queued = {e["pid"] for e in events if e.get("name") == "QUEUE"}
    assert {0, 1} <= done and queued == {0, 1, 2}, events
    assert result.returncode == 3, result.tail()
    assert "bfrun: rank 2 (on localhost) exited with status 3" in result.output
    assert "NOT REACHED" not in result.output
    # Killed, not timed out: well under BLUEFOG_GLOO_TIMEOUT (60 s) after the SUM lines.
    assert result.wall < 55, result.wall


def _digits_in_process(script, argv):
    """examples/tape_digits.py run inside a bluefog.run rank, its output returned."""
    import contextlib
    import io
    import runpy
    import sys

    sys.argv = ["tape_digits.py", *argv]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            runpy.run_path(script, run_name="__main__")
        except SystemExit as e:  # the script's own exit status (1: ranks' weights differ)
            if e.code not in (None, 0):
                raise
    return out.getvalue()


@needs_gloo
@pytest.mark.skipif(not have_mpirun(), reason="mpirun not installed (the MPI reference)")
@pytest.mark.skipif(os.environ.get("BLUEFOG_TEST_GLOO_DIGITS") != "1",
                    reason="~3 min: run by `make test-gloo` (BLUEFOG_TEST_GLOO_DIGITS=1)")
@pytest.mark.timeout(5 * JOB_TIMEOUT_S + 60)
def test_digits_same_accuracy_under_every_bootstrap(no_mpirun_env):
    run_env = no_mpi_launcher_env()
    """examples/tape_digits.py at 2 ranks started each way a Gloo job can start: bfrun --gloo,
    torchrun's variables (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE), TF_CONFIG alone, and
    bluefog.run; each reaches mpirun's test accuracy within 1 percentage point, with identical
    weights on the ranks."""
    argv = ["--epochs", "3"]
    args = [PYTHON, os.path.join(REPO, "examples", "tape_digits.py"), *argv]
    threads = {"TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1"}
    pattern = r"ranks=2 .*test accuracy=([\d.]+)"

    def tf_config(rank, port):
        workers = [f"127.0.0.1:{port}", "127.0.0.1:1"]
        return {"TF_CONFIG": json.dumps({"cluster": {"worker": workers},
                                         "task": {"type": "worker", "index": rank}})}

    outputs = {
        "mpirun": run_job(mpirun_prefix(2) + args, timeout=JOB_TIMEOUT_S, env=threads),
        "bfrun --gloo": bfrun(["-np", "2", *args], no_mpirun_env),
        "torchrun variables": run_gloo_job(args, 2, JOB_TIMEOUT_S, env=threads),
        "TF_CONFIG": run_gloo_job(args, 2, JOB_TIMEOUT_S, env=threads, rank_env=tf_config),
    }
    for how, job in outputs.items():
        assert job.returncode == 0 and not job.timed_out, f"{how}:\n{job.tail()}"
    outputs = {how: job.output for how, job in outputs.items()}
    outputs["bluefog.run"] = bluefog.run(_digits_in_process, args=(args[1], argv), np=2,
                                         env=run_env, timeout=JOB_TIMEOUT_S)[0]
    accuracy = {}
    for how, out in outputs.items():
        found = re.search(pattern, out)
        assert found and "weights identical on all ranks" in out, f"{how}:\n{out[-3000:]}"
        accuracy[how] = float(found.group(1))
    print("test accuracy by bootstrap:", accuracy)
    reference = accuracy.pop("mpirun")
    assert reference > 0.85, reference
    for how, acc in accuracy.items():
        assert abs(acc - reference) <= 0.01, (how, acc, reference)


@needs_gloo
@pytest.mark.skipif(netns_skip_reason() is not None, reason=str(netns_skip_reason()))
@pytest.mark.skipif(os.environ.get("BLUEFOG_TEST_GLOO_DIGITS") != "1",
                    reason="about 2 minutes: run by `make test-gloo` (BLUEFOG_TEST_GLOO_DIGITS=1)")
@pytest.mark.timeout(960)
def test_bfrun_gloo_digits_across_netns_hosts():
    """tests/multihost/gloo_netns.sh digits: examples/tape_digits.py under bfrun --gloo with
    both ranks on one network-namespace host, then one rank on each of two (the rsh agent of
    bfrun -H): the same test accuracy, and identical weights on the ranks of each run."""
    result = run_job(["tests/multihost/gloo_netns.sh", "digits"], timeout=900)
    if result.returncode == 77:
        pytest.skip(result.tail(400))
    print("\n".join(line for line in result.output.splitlines() if "digits:" in line))
    assert result.returncode == 0 and "[gloo_netns] all passed" in result.output, result.tail()
    accuracies = re.findall(r"digits: -H \S+: test accuracy ([\d.]+)", result.output)
    assert len(accuracies) == 2 and accuracies[0] == accuracies[1], result.tail()


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", "--rootdir", REPO]))
