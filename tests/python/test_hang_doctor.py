"""The hang doctor: when an operation waits past BLUEFOG_STALL_CHECK_TIME, the waiting ranks ask
the others what they do and print a diagnosis naming the culprit; bf.diagnose() asks on demand.
One job per backend at 3 ranks, going through the cases in turn: a rank sleeping in Python, a
rank in another collective, a rank holding a window mutex, a stopped (SIGSTOP) rank; then a
straggler, which bf.straggler_report() and rank 0's log name."""

import re
import textwrap

import pytest

from gloo_jobs import gloo_built, run_gloo_job
from mpi_jobs import PYTHON, have_mpirun, mpirun_prefix, run_job

_JOB = textwrap.dedent("""
    import os, signal, sys, time
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    import bluefog.tensorflow as bf
    bf.init()
    r = bf.rank()
    x = tf.ones([4])
    pids = bf.allgather(tf.constant([os.getpid()]), name="pids").numpy().tolist()

    def say(tag, text):
        print(f"<<{tag} rank {r}>>{text}<<end>>", flush=True)

    # On demand: every rank names every rank, idle after 'pids'.
    say("ondemand", bf.diagnose())

    # A rank sleeping in Python while the others wait in an allreduce.
    if r == 2:
        time.sleep(5)
    bf.allreduce(x, name="after_sleep")

    # A rank in another collective (queued without waiting) while the others wait.
    if r == 1:
        h = bf.broadcast_nonblocking(x, 0, name="bcast_first")
        time.sleep(5)
        bf.allreduce(x, name="reduce_first")
        bf.synchronize(h)
    else:
        bf.allreduce(x, name="reduce_first")
        bf.broadcast(x, 0, name="bcast_first")

    if sys.argv[1] == "mpi":
        # A rank holding a window mutex while another waits for it.
        bf.win_create(tf.zeros([2]), name="mw")
        if r == 0:
            with bf.win_mutex("mw", ranks=[1]):
                time.sleep(5)
        elif r == 2:
            time.sleep(1)
            with bf.win_mutex("mw", ranks=[1]):
                pass
        bf.allreduce(x, name="after_mutex")
        bf.win_free("mw")

    # A stopped rank does not answer; rank 0 continues it once it has its diagnosis.
    bf.allreduce(x, name="before_stop")
    if r == 2:
        os.kill(os.getpid(), signal.SIGSTOP)
    elif r == 0:
        time.sleep(1)
        say("stopped", bf.diagnose())
        os.kill(pids[2], signal.SIGCONT)
    bf.allreduce(x, name="after_stop")

    # A straggler: rank 1 comes 30 ms late to each of 120 allreduces (4 s). Rank 0 logs it
    # (BLUEFOG_STRAGGLER_REPORT=1) at a round a second later; every rank reports it. (The waits
    # travel with the next round: a few quick rounds first carry the last stall's waits.)
    for step in range(5):
        bf.allreduce(x, name="quick")
    time.sleep(1)
    for step in range(120):
        if r == 1:
            time.sleep(0.03)
        bf.allreduce(x, name="straggle")
    time.sleep(1.2)
    bf.allreduce(x, name="after_straggle")
    rep = bf.straggler_report()
    say("stragglers", " ".join(str(v) for v in (rep["straggler"], rep["ranks"][1]["last_ops"],
                                                rep["contested_ops"], rep["contested_seconds"],
                                                rep["ops"])))
    print(f"DONE {r}", flush=True)
    bf.shutdown()
    """)
_ENV = {"BLUEFOG_STALL_CHECK_TIME": "1.5", "BLUEFOG_STRAGGLER_REPORT": "1"}


def _blocks(out: str, tag: str):
    return {int(m.group(1)): m.group(2)
            for m in re.finditer(rf"<<{tag} rank (\d)>>(.*?)<<end>>", out, re.S)}


def _check(out: str, mpi: bool):
    ondemand = _blocks(out, "ondemand")
    assert sorted(ondemand) == [0, 1, 2], out
    for text in ondemand.values():
        for k in range(3):
            assert re.search(rf"rank {k} \(.*, pid \d+\): it is in no bluefog operation: its "
                             r"last, allgather 'pids'", text), text
    # Sleeping in Python: named by both waiting ranks, with its last operation.
    for k in (0, 1):
        assert re.search(rf"\[bluefog rank {k}\] WARNING: hang doctor: allreduce 'after_sleep' "
                         rf"has waited \d+\.\d s on rank {k}\.\n  rank 2 never called allreduce "
                         r"'after_sleep'; it is in no bluefog operation: its last, \w+ "
                         r"'\w+', ended [\d.]+ s ago \(it computes, reads input, sleeps or waits "
                         r"in Python\); its main thread is at <string>:\d+ in <module>", out), out
    # In another collective.
    for k in (0, 2):
        assert re.search(rf"on rank {k}\.\n  rank 1 never called allreduce 'reduce_first'; it is "
                         r"in broadcast 'bcast_first' since \d", out), out
    if mpi:
        assert re.search(r"win_mutex_acquire 'mw' has waited \d+\.\d s on rank 2\.\n  rank 0 "
                         r"holds the mutex of window 'mw' since \d[.\d]* s; it is in no bluefog "
                         r"operation: its last, win_mutex_acquire 'mw', ended [.\d]* s ago \(it "
                         r"computes, reads input, sleeps or waits in Python\); its main thread is "
                         r"at <string>:\d+ in <module>\.\n", out), out
    stopped = _blocks(out, "stopped")
    assert "rank 2 did not answer within 3.0 s: it is stopped (SIGSTOP)" in stopped.get(0, ""), out
    assert "rank 1 (" in stopped[0], stopped[0]
    assert all(f"DONE {k}" in out for k in range(3)), out
    # The straggler, in every rank's report and in rank 0's log.
    reports = {k: [int(v) if v != "None" else None for v in text.split()]
               for k, text in _blocks(out, "stragglers").items()}
    assert sorted(reports) == [0, 1, 2], out
    for straggler, last, contested, seconds, ops in reports.values():
        assert straggler == 1 and last >= 0.75 * contested, reports
        assert seconds >= 3 and ops >= 125, reports
    assert re.search(r"\[bluefog rank 0\] WARNING: straggler: the other ranks wait for rank 1: "
                     r"it came last to \d+ of the \d+ collectives of the last \d+ s", out), out
    assert "WARNING: straggler" not in out.replace("[bluefog rank 0] WARNING: straggler", ""), out
    # The doctor speaks instead of the channel's own stall warning.
    assert "a collective submitted on this rank has waited" not in out, out


@pytest.mark.skipif(not have_mpirun(), reason="mpirun not installed")
def test_hang_doctor_mpi():
    result = run_job(mpirun_prefix(3) + [PYTHON, "-c", _JOB, "mpi"], timeout=150, env=_ENV)
    assert result.returncode == 0 and not result.timed_out, result.tail()
    _check(result.output, mpi=True)


@pytest.mark.skipif(not gloo_built(), reason="bluefog built without Gloo")
def test_hang_doctor_gloo():
    result = run_gloo_job([PYTHON, "-c", _JOB, "gloo"], 3, timeout=150, env=_ENV)
    assert result.returncode == 0 and not result.timed_out, result.output[-6000:]
    _check(result.output, mpi=False)


@pytest.mark.skipif(not have_mpirun(), reason="mpirun not installed")
def test_doctor_off_keeps_the_stall_warning():
    """BLUEFOG_HANG_DOCTOR=0: no doctor; the stall warning of the collectives stays, and
    bf.diagnose() says why it cannot ask."""
    code = textwrap.dedent("""
        import time
        import tensorflow as tf
        import bluefog.tensorflow as bf
        bf.init()
        print("DIAG:", bf.diagnose(), flush=True)
        if bf.rank() == 1:
            time.sleep(3)
        bf.allreduce(tf.ones([2]), name="late")
        bf.shutdown()
        """)
    result = run_job(mpirun_prefix(2) + [PYTHON, "-c", code], timeout=90,
                     env={"BLUEFOG_STALL_CHECK_TIME": "1", "BLUEFOG_HANG_DOCTOR": "0"})
    assert result.returncode == 0, result.tail()
    assert "DIAG: the hang doctor is off (BLUEFOG_HANG_DOCTOR=0" in result.output, result.tail()
    assert "a collective submitted on this rank has waited" in result.output, result.tail()
    assert "hang doctor:" not in result.output, result.tail()
