"""The Gloo backend end to end: jobs started without mpirun (MASTER_ADDR, MASTER_PORT, RANK,
WORLD_SIZE, as torchrun or a scheduler sets them), at 2 ranks on this host.

Plain pytest: each test starts its own job through gloo_jobs.run_gloo_job. Asserted: the
backend is chosen and reported, a representative part of the TF suite (tests/python/mpi) passes
unchanged on it, windows work over Gloo's point-to-point messages (a lost peer is named), a rank
that never arrives ends the job within BLUEFOG_GLOO_TIMEOUT with an error naming it.
"""

import json
import os
import re
import textwrap

import pytest

from gloo_jobs import gloo_built, run_gloo_job
from mpi_jobs import PYTHON, REPO, netns_skip_reason, run_job

JOB_TIMEOUT_S = 180
# Each job's own timeout fires before pytest-timeout's (which would end the whole session), so a
# hang fails its test with the ranks' output.
pytestmark = [pytest.mark.skipif(not gloo_built(),
                                 reason="bluefog was built without Gloo (libgloo-dev)"),
              pytest.mark.timeout(JOB_TIMEOUT_S + 60)]

# The parts of the TF suite that run on Gloo as they are: collectives of every kind and dtype,
# gradients and optimizers, process sets, neighbour collectives, Horovod's API.
SUITE = ["test_collectives.py", "test_gradients.py", "test_process_sets.py",
         "test_decentralized.py", "test_horovod_api.py"]
# Start-up (2 TensorFlow imports on 2 busy cores) plus the suite: ~30 s measured.
SUITE_TIMEOUT_S = 600


def _script(tmp_path, body: str) -> str:
    path = tmp_path / "job.py"
    path.write_text(textwrap.dedent(body))
    return str(path)


def test_backend_chosen_without_mpirun(tmp_path):
    job = _script(tmp_path, """
        import tensorflow as tf
        import bluefog.tensorflow as bf
        bf.init()
        r, n = bf.rank(), bf.size()
        x = bf.allreduce(tf.constant([float(r + 1)] * 3), average=False)
        assert x.numpy().tolist() == [n * (n + 1) / 2] * 3, x
        assert bf.backend() == "gloo" and bf.gloo_enabled() and not bf.mpi_enabled()
        assert (bf.local_rank(), bf.local_size()) == (r, n)
        print("OK", r, bf.backend())
        """)
    result = run_gloo_job([PYTHON, job], 2, JOB_TIMEOUT_S)
    assert result.returncode == 0 and not result.timed_out, result.tail()
    assert result.output.count("OK") == 2 and "OK 1 gloo" in result.output


@pytest.mark.timeout(SUITE_TIMEOUT_S + 60)
def test_suite_subset_passes_on_gloo():
    files = [os.path.join("tests/python/mpi", f) for f in SUITE]
    result = run_gloo_job(["tests/mpi_pytest.sh", PYTHON, *files, "-rfE"], 2, SUITE_TIMEOUT_S)
    assert not result.timed_out, f"the suite hung on Gloo:\n{result.tail()}"
    assert result.returncode == 0, result.tail(20000)
    passed = re.search(r"(\d+) passed", result.output)
    # 301 tests on 2 ranks when written; fewer means the files were not all collected.
    assert passed and int(passed.group(1)) >= 290 and "failed" not in result.output, (
        result.tail())


def test_windows_work_on_gloo(tmp_path):
    """A put, an accumulate, a get and a mutex over the Gloo window link, values checked."""
    job = _script(tmp_path, """
        import tensorflow as tf
        import bluefog.tensorflow as bf
        bf.init()
        r, n = bf.rank(), bf.size()
        other = 1 - r
        assert bf.win_create(tf.fill([4], float(r)), "w", zero_init=True)
        bf.win_put(tf.fill([4], 10.0 + r), "w", dst_weights={other: 1.0})
        bf.barrier()
        got = bf.win_update("w", self_weight=0.0, neighbor_weights={other: 1.0})
        assert got.numpy().tolist() == [10.0 + other] * 4, got
        bf.barrier()  # both read their buffer before either accumulates into the other's
        bf.win_accumulate(tf.fill([4], 1.0), "w", dst_weights={other: 2.0},
                          require_mutex=True)
        bf.barrier()
        got = bf.win_update("w", self_weight=0.0, neighbor_weights={other: 1.0}, reset=True)
        assert got.numpy().tolist() == [12.0 + other] * 4, got
        with bf.win_mutex("w", for_self=True):
            pass
        bf.barrier()
        bf.win_get("w", src_weights={other: 0.5})
        got = bf.win_update("w", self_weight=0.0, neighbor_weights={other: 1.0})
        print("GET", r, got.numpy().tolist())
        assert bf.win_free("w")
        print("OK", r)
        """)
    result = run_gloo_job([PYTHON, job], 2, JOB_TIMEOUT_S)
    assert result.returncode == 0 and not result.timed_out, result.tail()
    assert result.output.count("OK") == 2, result.tail()


def test_window_peer_lost_is_named(tmp_path):
    """Rank 1 exits after win_create; rank 0's gets from it then fail, naming rank 1, within
    seconds (the link's peer check), not at the job's timeout."""
    job = _script(tmp_path, """
        import os, time
        import tensorflow as tf
        import bluefog.tensorflow as bf
        bf.init()
        r = bf.rank()
        bf.win_create(tf.zeros([4]), "w")
        bf.barrier()
        if r == 1:
            os._exit(3)
        time.sleep(1.0)
        start = time.time()
        try:
            for _ in range(20):
                bf.win_get("w", src_weights={1: 1.0})
        except Exception as e:  # the op's error, as TensorFlow raises it
            print("ERROR after %.1f s:" % (time.time() - start), e)
        else:
            print("NO ERROR")
        os._exit(0)
        """)
    result = run_gloo_job([PYTHON, job], 2, JOB_TIMEOUT_S,
                          env={"BLUEFOG_GLOO_TIMEOUT": "60"})
    assert not result.timed_out, result.tail()
    assert "NO ERROR" not in result.output, result.tail()
    m = re.search(r"ERROR after ([0-9.]+) s:(.*)", result.output)
    assert m, result.tail()
    assert float(m.group(1)) < 30, result.tail()
    assert "rank 0: bluefog win_get of window 'w'" in m.group(2), result.tail()
    assert ("rank(s) 1 left the job" in m.group(2) or "with rank 1 failed" in m.group(2)), (
        result.tail())


def test_missing_rank_is_named_after_the_timeout(tmp_path):
    job = _script(tmp_path, """
        import bluefog.tensorflow as bf
        bf.init()
        """)
    # Ranks 0 and 2 of 3 start; rank 1 never does.
    result = run_gloo_job([PYTHON, job], 3, JOB_TIMEOUT_S, ranks=[0, 2],
                          env={"BLUEFOG_GLOO_TIMEOUT": "3"})
    assert not result.timed_out, result.tail()
    assert result.returncode != 0
    assert "rank(s) 1 of 3 never arrived" in result.output, result.tail()
    assert "BLUEFOG_GLOO_TIMEOUT" in result.output


def test_rendezvous_says_whom_it_waits_for(tmp_path):
    job = _script(tmp_path, """
        import bluefog.tensorflow as bf
        bf.init()
        """)
    # Ranks 0 and 2 of 3 start; rank 1 never does. Both say so every few seconds, before the
    # timeout ends the job.
    result = run_gloo_job([PYTHON, job], 3, JOB_TIMEOUT_S, ranks=[0, 2],
                          env={"BLUEFOG_GLOO_TIMEOUT": "12"})
    assert not result.timed_out, result.tail()
    for rank in (0, 2):
        lines = re.findall(rf"\[bluefog rank {rank}\] WARNING: Gloo rendezvous at \S+: "
                           r"waiting for rank\(s\) 1 of 3 \((\d+) s of 12\)", result.output)
        assert len(lines) >= 2, result.tail()
        assert 0 < int(lines[0]) < int(lines[1]) < 12, result.tail()
    assert "rank(s) 1 of 3 never arrived" in result.output, result.tail()


@pytest.mark.parametrize("mode", ["sigkill", "raise"])
def test_lost_rank_ends_the_job(mode):
    """Rank 1 of 3 dies at step 20 of an allreduce loop (tests/faults/rank_fault.py): the
    survivors fail with an error naming themselves, the failed call and the rank that left,
    well within the job's timeout (6-9 s measured, start-up included)."""
    result = run_gloo_job([PYTHON, "tests/faults/rank_fault.py", mode, "--victim", "1",
                           "--step", "20"], 3, JOB_TIMEOUT_S)
    assert not result.timed_out, f"the job hung after the fault:\n{result.tail()}"
    assert result.returncode != 0
    # Killed: the survivors, waiting for it in a round through the host's shared memory, see
    # its process gone (over TCP across hosts: their broken Gloo call, with the rank rank 0's
    # server saw leave). Raised: rank 1's shutdown reached the others in a negotiation round.
    named = "rank(s) 1 left the job" if mode == "sigkill" else "rank 1 shut down"
    for survivor in (0, 2):
        assert f"rank {survivor}: bluefog allreduce" in result.output, result.tail()
    assert result.output.count(named) >= 2, result.tail()


def test_tf_config_starts_a_gloo_job(tmp_path):
    """Only TF_CONFIG: bf.init() derives the rendezvous from it. Two workers make a job of 2;
    Vertex AI's layout (the chief in worker pool 0, then two workers) a job of 3 with the chief as
    rank 0 (MultiWorkerMirroredStrategy's order); a cluster that also lists a parameter server
    is refused on every process of it, with one message."""
    job = _script(tmp_path, """
        import json, os
        import tensorflow as tf
        import bluefog.tensorflow as bf
        task = json.loads(os.environ["TF_CONFIG"])["task"]
        bf.init()
        x = bf.allreduce(tf.constant([float(bf.rank())]), average=False)
        print("TFCONFIG", task["type"], task["index"], bf.backend(), bf.rank(), bf.size(),
              x.numpy()[0])
        """)

    def tf_config(roles):
        """The harness's process r is task roles[r]; the chief (or worker 0) serves the port."""
        def rank_env(rank, port):
            cluster = {}
            for r, (kind, _) in enumerate(roles):
                cluster.setdefault(kind, []).append(f"127.0.0.1:{port + r}")
            kind, index = roles[rank]
            return {"TF_CONFIG": json.dumps({"cluster": cluster, "environment": "cloud",
                                             "task": {"type": kind, "index": index}})}
        return rank_env

    workers = [("worker", 0), ("worker", 1)]
    result = run_gloo_job([PYTHON, job], 2, JOB_TIMEOUT_S, rank_env=tf_config(workers))
    assert result.returncode == 0 and not result.timed_out, result.tail()
    assert "TFCONFIG worker 0 gloo 0 2 1.0" in result.output, result.tail()
    assert "TFCONFIG worker 1 gloo 1 2 1.0" in result.output, result.tail()

    vertex = [("chief", 0), ("worker", 0), ("worker", 1)]
    result = run_gloo_job([PYTHON, job], 3, JOB_TIMEOUT_S, rank_env=tf_config(vertex))
    assert result.returncode == 0 and not result.timed_out, result.tail()
    for line in ("chief 0 gloo 0 3 3.0", "worker 0 gloo 1 3 3.0", "worker 1 gloo 2 3 3.0"):
        assert f"TFCONFIG {line}" in result.output, result.tail()

    with_ps = vertex + [("ps", 0)]
    result = run_gloo_job([PYTHON, job], 4, JOB_TIMEOUT_S, rank_env=tf_config(with_ps))
    assert result.returncode != 0 and not result.timed_out, result.tail()
    assert "TFCONFIG" not in result.output, result.tail()
    refusals = re.findall(r"TF_CONFIG's cluster lists 'ps': [^\n]*", result.output)
    assert len(refusals) == 4 and len(set(refusals)) == 1, result.tail()


@pytest.mark.parametrize("value", [pytest.param("inf", marks=pytest.mark.nightly), "1e10"])
def test_unusable_gloo_timeout_is_refused_at_init(tmp_path, value):
    """BLUEFOG_GLOO_TIMEOUT beyond what a timer can hold fails bf.init() at once on every rank,
    naming the variable and the accepted range (tests/cpp/config_test.cc: the other values)."""
    job = _script(tmp_path, """
        import bluefog.tensorflow as bf
        try:
            bf.init()
        except Exception as e:
            print("REFUSED", e)
        else:
            print("ACCEPTED")
        """)
    result = run_gloo_job([PYTHON, job], 2, JOB_TIMEOUT_S, env={"BLUEFOG_GLOO_TIMEOUT": value})
    assert not result.timed_out, result.tail()
    assert result.output.count(f"REFUSED environment variable BLUEFOG_GLOO_TIMEOUT='{value}' "
                               "is not a number of seconds from 0.001 to 1000000") == 2, \
        result.tail()


@pytest.mark.parametrize("bootstrap", ["torchrun", "child_of_singleton",
                                       pytest.param("tf_config", marks=pytest.mark.nightly)])
def test_mpi4py_imported_first_still_one_job(tmp_path, bootstrap):
    """mpi4py imported before bf.init() makes MPI's singleton set PMIX_RANK=0 (and more) inside
    each process; that is not a launcher, so the two processes still form one Gloo job. Nor is
    a child that inherited those variables from a parent that imported mpi4py."""
    pytest.importorskip("mpi4py")
    job = _script(tmp_path, """
        from mpi4py import MPI
        import tensorflow as tf
        import bluefog.tensorflow as bf
        assert MPI.COMM_WORLD.Get_size() == 1
        bf.init()
        x = bf.allreduce(tf.constant([float(bf.rank() + 1)]), average=False)
        print("MPI4PY", bf.backend(), bf.rank(), bf.size(), x.numpy()[0])
        """)
    cmd = [PYTHON, job]
    if bootstrap == "child_of_singleton":
        parent = tmp_path / "parent.py"
        parent.write_text(textwrap.dedent(f"""
            import subprocess, sys
            from mpi4py import MPI
            MPI.COMM_WORLD.Barrier()
            # env=None: the child inherits the C environment, MPI's variables included.
            sys.exit(subprocess.run([sys.executable, {job!r}]).returncode)
            """))
        cmd = [PYTHON, str(parent)]
    rank_env = None
    if bootstrap == "tf_config":
        def rank_env(rank, port):
            workers = [f"127.0.0.1:{port}", "127.0.0.1:1"]
            return {"TF_CONFIG": json.dumps({"cluster": {"worker": workers},
                                             "task": {"type": "worker", "index": rank}})}
    result = run_gloo_job(cmd, 2, JOB_TIMEOUT_S, rank_env=rank_env)
    assert result.returncode == 0 and not result.timed_out, result.tail()
    for rank in (0, 1):
        assert f"MPI4PY gloo {rank} 2 3.0" in result.output, result.tail()


@pytest.mark.nightly  # (across pretend hosts in make test: ctest's forced_gloo_across_hosts)
@pytest.mark.skipif(netns_skip_reason() is not None, reason=str(netns_skip_reason()))
def test_two_netns_hosts():
    """tests/multihost/gloo_netns.sh: 2 network-namespace hosts, one rank each, no mpirun:
    each rank alone on its host (local_size 1, cross_size 2), started directly and by
    bfrun --gloo -H through a remote-shell agent, and the collectives, process sets and Horovod
    API tests across them."""
    result = run_job(["tests/multihost/gloo_netns.sh"], timeout=SUITE_TIMEOUT_S)
    if result.returncode == 77:
        pytest.skip(result.tail(400))
    assert result.returncode == 0 and "[gloo_netns] all passed" in result.output, result.tail()


def test_mpi_launcher_variables_keep_mpi(tmp_path):
    """With the rendezvous variables set but BLUEFOG_BACKEND=mpi, a lone process is MPI's
    singleton, as before."""
    job = _script(tmp_path, """
        import bluefog.tensorflow as bf
        bf.init()
        print("BACKEND", bf.backend(), bf.size())
        """)
    result = run_gloo_job([PYTHON, job], 1, JOB_TIMEOUT_S, env={"BLUEFOG_BACKEND": "mpi"})
    assert result.returncode == 0, result.tail()
    assert "BACKEND mpi 1" in result.output


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", "--rootdir", REPO]))


def _can_unshare_mounts() -> bool:
    import shutil
    import subprocess

    if os.geteuid() != 0 or not shutil.which("unshare"):
        return False
    probe = subprocess.run(["unshare", "--mount", "true"], capture_output=True)
    return probe.returncode == 0


@pytest.mark.skipif(not _can_unshare_mounts(),
                    reason="needs root and unshare --mount (a private /etc/hosts)")
def test_rank0_waits_for_its_name_to_resolve(tmp_path):
    """MASTER_ADDR names rank 0's own host before the name resolves (Kubernetes publishes a
    pod's DNS name only once it runs): rank 0 retries instead of failing at once. Here the name
    appears in a private /etc/hosts 2 s after rank 0 began bf.init()."""
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 localhost\n")
    started = tmp_path / "started"
    job = _script(tmp_path, f"""
        import bluefog.tensorflow as bf
        open({str(started)!r}, "w").close()
        bf.init()
        print("backend", bf.backend(), "size", bf.size(), flush=True)
        bf.shutdown()
        """)
    script = (f"mount --bind {hosts} /etc/hosts || exit 1; "
              f"(while [ ! -e {started} ]; do sleep 0.1; done; sleep 2; "
              f"echo '127.0.0.1 late-rank0.test' >> {hosts}) & "
              f"exec {PYTHON} {job}")
    result = run_gloo_job(["unshare", "--mount", "sh", "-c", script], 1, JOB_TIMEOUT_S,
                          env={"MASTER_ADDR": "late-rank0.test", "BLUEFOG_GLOO_TIMEOUT": "60"})
    assert not result.timed_out, result.tail()
    assert result.returncode == 0, result.tail()
    assert "does not resolve yet" in result.output, result.tail()
    assert "backend gloo size 1" in result.output, result.tail()
