"""bluefog under Slurm, as docs/launching.md "Running under Slurm" shows it, on a real Slurm.

The test brings up a one-node cluster on this machine from Debian's packages (``slurm-wlm``,
``munge``; ``make test-slurm`` installs them): ``munged``, ``slurmctld`` and ``slurmd`` in a
temporary folder with their own ports, started here and stopped at the end. It then runs the
digits example on 2 ranks through ``sbatch`` with ``mpirun`` and ``bfrun`` inside the
allocation, and through ``srun --mpi=pmix`` (Slurm starts the ranks itself), and checks the
accuracy each run prints. Starting the daemons needs root: otherwise the test is skipped.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PYTHON = sys.executable
DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "sinfo")
JOB_TIMEOUT_S = 420

if not hasattr(os, "geteuid") or os.geteuid() != 0:
    pytest.skip("the Slurm test starts slurmctld, slurmd and munged, which needs root; run it "
                "as root (make test-slurm)", allow_module_level=True)
_missing = [d for d in DAEMONS if shutil.which(d) is None and not os.path.exists(f"/usr/sbin/{d}")]
if _missing:
    pytest.fail(f"Slurm/munge programs missing: {_missing}; install them with "
                "apt-get install slurm-wlm munge (make test-slurm does)", pytrace=False)


def _which(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    """munged + slurmctld + slurmd for one node (this machine), in a private folder."""

    def __init__(self, root: str):
        self.root = root
        self.procs: list[subprocess.Popen] = []
        self.host = socket.gethostname().split(".")[0]
        self.conf = os.path.join(root, "slurm.conf")
        self.env = dict(os.environ, SLURM_CONF=self.conf)
        for var in [v for v in self.env if v.startswith("SLURM_") and v != "SLURM_CONF"]:
            del self.env[var]  # a Slurm job's variables would confuse this cluster's commands

    def path(self, *parts: str) -> str:
        return os.path.join(self.root, *parts)

    def start(self) -> None:
        for d in ("munge", "state", "spool", "log"):
            os.makedirs(self.path(d), mode=0o700, exist_ok=True)
        os.chmod(self.root, 0o755)
        key = self.path("munge", "munge.key")
        subprocess.run([_which("mungekey"), "--create", "--keyfile", key], check=True)
        sock = self.path("munge", "munge.socket")
        self._spawn([_which("munged"), "--foreground", "--force", "--key-file", key,
                     "--socket", sock, "--pid-file", self.path("munge", "munged.pid"),
                     "--log-file", self.path("log", "munged.log"),
                     "--seed-file", self.path("munge", "munged.seed")], "munged")
        self._wait(lambda: os.path.exists(sock), "munged's socket", 30)
        cpus = os.cpu_count() or 2
        with open(self.conf, "w") as f:
            f.write(f"""ClusterName=bluefogtest
SlurmctldHost={self.host}(127.0.0.1)
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={sock}
CredType=cred/munge
StateSaveLocation={self.path("state")}
SlurmdSpoolDir={self.path("spool")}
SlurmctldPidFile={self.path("slurmctld.pid")}
SlurmdPidFile={self.path("slurmd.pid")}
SlurmctldLogFile={self.path("log", "slurmctld.log")}
SlurmdLogFile={self.path("log", "slurmd.log")}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
SlurmdTimeout=60
NodeName={self.host} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN
PartitionName=test Nodes={self.host} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
""")
        self._spawn([_which("slurmctld"), "-D", "-i", "-f", self.conf], "slurmctld")
        self._spawn([_which("slurmd"), "-D", "-f", self.conf], "slurmd")

        def node_ready() -> bool:
            out = subprocess.run(["sinfo", "-h", "-o", "%t"], env=self.env, text=True,
                                 capture_output=True).stdout.strip()
            return out in ("idle", "mix", "alloc")

        self._wait(node_ready, "the Slurm node to come up idle", 90)

    def _spawn(self, cmd: list[str], name: str) -> None:
        log = open(self.path("log", name + ".out"), "w")
        self.procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                           env=self.env, start_new_session=True))

    def _wait(self, ready, what: str, timeout: float) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            for p in self.procs:
                if p.poll() is not None:
                    raise RuntimeError(f"{p.args[0]} exited ({p.returncode}) while waiting for "
                                       f"{what}:\n{self.logs()}")
            if ready():
                return
            time.sleep(0.5)
        raise RuntimeError(f"timed out waiting for {what}:\n{self.logs()}")

    def logs(self) -> str:
        out = []
        for name in sorted(os.listdir(self.path("log"))):
            with open(self.path("log", name), errors="replace") as f:
                out.append(f"--- {name}\n{f.read()[-3000:]}")
        return "\n".join(out)

    def stop(self) -> None:
        subprocess.run(["scancel", "--full", "-u", "root"], env=self.env, capture_output=True)
        for p in reversed(self.procs):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in reversed(self.procs):
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()

    def sbatch(self, script: str) -> str:
        """Submits ``script``, waits for the job, returns what it printed."""
        job = self.path(f"job{len(os.listdir(self.root))}.sh")
        out = job + ".out"
        with open(job, "w") as f:
            f.write(script)
        try:
            subprocess.run(["sbatch", "--wait", "--output", out, "--chdir", REPO, job],
                           env=self.env, check=True, timeout=JOB_TIMEOUT_S, capture_output=True,
                           text=True)
        except subprocess.CalledProcessError as e:
            raise AssertionError(
                f"the job failed: {e.stderr}\n{_read(out)}\n{self.logs()}") from None
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"the job did not finish in {JOB_TIMEOUT_S}s:\n{_read(out)}") from None
        return _read(out)


def _read(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return "(no output)"


@pytest.fixture(scope="module")
def cluster():
    root = tempfile.mkdtemp(prefix="bluefog-slurm-")
    c = Cluster(root)
    try:
        c.start()
        yield c
    finally:
        c.stop()
        shutil.rmtree(root, ignore_errors=True)


def _accuracy(out: str) -> float:
    assert re.search(r"slurm job \d+: 2 tasks on ", out), out[-3000:]
    found = re.search(r"test accuracy=([\d.]+)", out)
    assert found, f"no accuracy printed:\n{out[-3000:]}"
    assert "weights identical on all ranks" in out, out[-3000:]
    return float(found.group(1))


# What every job script starts with: 2 tasks on the node, few TF threads per rank, and the
# environment's Python (the one running this test) on PATH, as a user's activated venv would be.
HEADER = f"""#!/bin/bash
#SBATCH --job-name=bluefog-digits
#SBATCH --ntasks=2
#SBATCH --time=10
set -euo pipefail
export PATH={os.path.dirname(PYTHON)}:$PATH
export TF_CPP_MIN_LOG_LEVEL=3 TF_NUM_INTRAOP_THREADS=1 TF_NUM_INTEROP_THREADS=1
EXAMPLE="examples/keras_digits.py --epochs 3"
echo "slurm job $SLURM_JOB_ID: $SLURM_NTASKS tasks on $SLURM_JOB_NODELIST"
"""


@pytest.mark.timeout(JOB_TIMEOUT_S + 200)
def test_sbatch_with_mpirun_inside_the_allocation(cluster):
    # mpirun reads the allocation from Slurm: no -np, no host list.
    out = cluster.sbatch(HEADER + "mpirun --allow-run-as-root --bind-to none "
                         f"{PYTHON} $EXAMPLE\n")
    assert "ranks=2 " in out, out[-3000:]
    assert _accuracy(out) > 0.85


@pytest.mark.timeout(JOB_TIMEOUT_S + 200)
def test_sbatch_with_bfrun_inside_the_allocation(cluster):
    out = cluster.sbatch(HEADER + f"bfrun -np $SLURM_NTASKS {PYTHON} $EXAMPLE\n")
    assert "ranks=2 " in out, out[-3000:]
    assert _accuracy(out) > 0.85


@pytest.mark.timeout(JOB_TIMEOUT_S + 200)
def test_srun_starts_the_ranks_through_pmix(cluster):
    out = cluster.sbatch(HEADER + f"srun --mpi=pmix {PYTHON} $EXAMPLE\n")
    assert "ranks=2 " in out, out[-3000:]
    assert _accuracy(out) > 0.85
