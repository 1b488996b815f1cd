"""``bluefog.run``: a function run as every rank of a Gloo job (bluefog/run/runner.py), its
results in rank order, Horovod's arguments, errors naming the rank, and what the rendezvous does
with connections that are not the job's. Real processes, TensorFlow and Gloo; every job has a
timeout.
"""

import os
import sys
import time

import cloudpickle
import pytest

import bluefog

from gloo_jobs import gloo_built, no_mpi_launcher_env
from mpi_jobs import REPO

needs_gloo = pytest.mark.skipif(not gloo_built(),
                                reason="bluefog was built without Gloo (libgloo-dev)")
JOB_TIMEOUT_S = 240
pytestmark = pytest.mark.timeout(JOB_TIMEOUT_S + 60)  # the job's own timeout fires first
# The functions below are not importable on the ranks (this file is not a package module):
# they travel by value, as a script's own functions do.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture
def run_env():
    return no_mpi_launcher_env()


def _collective_with_strays(scale):
    """Rank 0 sends the rendezvous a garbage connection and another job's rank, then
    both ranks allreduce: the store refuses both (logged) and the job goes on."""
    import os
    import socket

    import tensorflow as tf

    import bluefog.tensorflow as bf
    from bluefog.common import gloo_store

    bf.init()
    answers = []
    if bf.rank() == 0:
        addr = (os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
        with socket.create_connection(addr, timeout=10) as s:
            s.sendall(b"GET / HTTP/1.1\r\n\r\n" + bytes(range(256)))
            answers.append(s.recv(16))  # closed: b""
        try:  # another job's rank: the handshake's proofs do not match
            gloo_store.StoreClient(*addr, gloo_store.job_token("another job"), rank=1,
                                   timeout=10)
            answers.append("accepted")
        except ConnectionError:
            answers.append("refused")
    x = bf.allreduce(tf.constant([scale * (bf.rank() + 1)]), average=False)
    return bf.rank(), bf.size(), float(x.numpy()[0]), answers


@needs_gloo
def test_run_returns_every_ranks_result_and_refuses_strays(run_env, capfd):
    results = bluefog.run(_collective_with_strays, args=(2.0,), np=2, env=run_env,
                          timeout=JOB_TIMEOUT_S)
    assert results == [(0, 2, 6.0, [b"", "refused"]), (1, 2, 6.0, [])]
    err = capfd.readouterr().err
    assert "did not open with bluefog's handshake" in err, err[-3000:]
    assert "its job token differs from this job's" in err, err[-3000:]


def _fails_on_rank_one(n):
    import os
    import time

    if os.environ["RANK"] == "1":
        raise ValueError(f"no good: {n}")
    time.sleep(120)  # ended by bluefog.run when rank 1 fails
    return n


def test_run_raises_naming_the_rank(run_env):
    started = time.time()
    with pytest.raises(RuntimeError, match=r"rank 1 raised ValueError: no good: 7") as info:
        bluefog.run(_fails_on_rank_one, args=(7,), np=2, env=run_env, timeout=JOB_TIMEOUT_S)
    assert isinstance(info.value.__cause__, ValueError)
    assert time.time() - started < 60


def _prints_without_newline(n):
    import os
    import sys

    me = os.environ.get("RANK") or os.environ["BLUEFOG_ELASTIC_WORKER"]  # elastic: no RANK yet
    sys.stdout.write(f"partial line of rank {me}")  # no newline after it
    return n * 2


@pytest.mark.parametrize("elastic", [False, True])
def test_run_result_after_output_without_newline(run_env, capfd, elastic):
    """The function's last output has no newline: its result still comes back, and the text
    is still printed."""
    extra = {"min_num_proc": 1, "hosts": "localhost:2"} if elastic else {}
    results = bluefog.run(_prints_without_newline, args=(21,), np=2, env=run_env,
                          timeout=JOB_TIMEOUT_S, **extra)
    assert results == [42, 42]
    out = capfd.readouterr().out
    assert "partial line of rank 0" in out and "partial line of rank 1" in out, out
    assert "bluefog-run-result-" not in out, out


def test_run_lambda_results_in_rank_order(run_env):
    offset = 10
    # use_gloo / use_mpi as Horovod's examples pass them (horovod.run(..., use_gloo=True)).
    out = bluefog.run(lambda k: int(__import__("os").environ["RANK"]) * k + offset, args=(3,),
                      np=3, env=run_env, timeout=JOB_TIMEOUT_S, use_gloo=True, use_mpi=False)
    assert out == [10, 13, 16]


def test_run_elastic_arguments_run_the_in_place_driver(run_env):
    """min_num_proc/max_num_proc: the job runs under bfrun --gloo --min-np's driver (each
    worker has its elastic worker id) and the results come back in rank order."""
    out = bluefog.run(lambda: (os.environ["BLUEFOG_ELASTIC_WORKER"],
                               os.environ["BLUEFOG_GLOO_EXTERNAL_STORE"]),
                      num_proc=2, min_num_proc=1, max_num_proc=3, hosts="localhost:3",
                      use_gloo=True, env=run_env)
    assert out == [("0", "1"), ("1", "1")]


def test_run_takes_horovods_arguments(run_env, tmp_path):
    """horovod.run's names: num_proc, hostfile, start_timeout, disable_cache; the ones with no
    meaning for a Gloo job are refused naming what to do instead."""
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# this machine\nlocalhost slots=2\n")
    out = bluefog.run(lambda: (os.environ["RANK"], os.environ["BLUEFOG_GLOO_TIMEOUT"],
                               os.environ["BLUEFOG_CACHE_CAPACITY"]),
                      num_proc=2, hostfile=str(hostfile), start_timeout=45, disable_cache=True,
                      use_gloo=True, env=run_env, timeout=JOB_TIMEOUT_S)
    assert out == [("0", "45.0", "0"), ("1", "45.0", "0")]
    with pytest.raises(ValueError, match="always starts a Gloo job"):
        bluefog.run(abs, args=(1,), num_proc=2, use_mpi=True)
    with pytest.raises(ValueError, match=r"slots: not supported: give each host's slots"):
        bluefog.run(abs, args=(1,), num_proc=2, min_num_proc=1, slots=3)
    with pytest.raises(ValueError, match=r"--reset-limit must be >= 0, got -1"):
        bluefog.run(abs, args=(1,), num_proc=2, min_num_proc=1, reset_limit=-1)
    with pytest.raises(ValueError, match=r"--blacklist-cooldown-range needs 0 <= MIN <= MAX"):
        bluefog.run(abs, args=(1,), num_proc=2, min_num_proc=1, cooldown_range=(5, 1))
    with pytest.raises(ValueError, match="min_np=1 and min_num_proc=2 disagree"):
        bluefog.run(abs, args=(1,), min_np=1, min_num_proc=2)
    with pytest.raises(ValueError, match="--max-np 1 is below --min-np 2"):
        bluefog.run(abs, args=(1,), min_num_proc=2, max_num_proc=1, hosts="localhost:2")
    with pytest.raises(ValueError, match="np=2 and num_proc=3 disagree"):
        bluefog.run(abs, args=(1,), np=2, num_proc=3)
    hostfile.write_text("localhost cpus=2\n")
    with pytest.raises(ValueError, match="line 1: expected 'host slots=N'"):
        bluefog.run(abs, args=(1,), hostfile=str(hostfile))
    with pytest.warns(UserWarning, match="verbose=2 has no effect"):
        assert bluefog.run(abs, args=(-3,), verbose=2, env=run_env, timeout=JOB_TIMEOUT_S) == [3]



if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", "--rootdir", REPO]))
