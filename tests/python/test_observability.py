"""Timeline files, stall handling and the eager C API switch, each in a job of its own (they are
configured at init)."""

import glob
import json
import re
import textwrap

from mpi_jobs import PYTHON, mpirun_prefix, run_job

_PRELUDE = ("import tensorflow as tf\n"
            "tf.config.threading.set_intra_op_parallelism_threads(1)\n"
            "import bluefog.tensorflow as bf\n")


def _job(code: str, np: int, env: dict, timeout: float = 120):
    return run_job(mpirun_prefix(np) + [PYTHON, "-c", _PRELUDE + textwrap.dedent(code)],
                   timeout=timeout, env=env)


def test_timeline_is_valid_chrome_trace_per_rank(tmp_path):
    prefix = str(tmp_path / "timeline.")
    result = _job("""
        bf.init()
        for step in range(3):
            bf.allreduce(tf.ones([10]), name="grad/w")
            bf.allgather(tf.ones([bf.rank() + 1]), name='odd "name"')
            bf.broadcast(tf.ones([2]), root_rank=0, name="bcast")
        bf.shutdown()
        """, np=2, env={"BLUEFOG_TIMELINE": prefix})
    assert result.returncode == 0, result.tail()
    files = sorted(glob.glob(prefix + "*.json"))
    assert [f[len(prefix):] for f in files] == ["0.json", "1.json"]
    for rank, path in enumerate(files):
        events = json.load(open(path))
        tracks = {e["tid"]: e["args"]["name"] for e in events if e.get("name") == "thread_name"}
        assert set(tracks.values()) == {"grad/w", 'odd "name"', "bcast"}
        phases = [(tracks[e["tid"]], e["name"]) for e in events if e["ph"] == "X"]
        for tensor, op in (("grad/w", "allreduce"), ('odd "name"', "allgather"),
                           ("bcast", "broadcast")):
            for phase in ("QUEUE", "NEGOTIATE", op):
                assert phases.count((tensor, phase)) == 3, (path, tensor, phase, phases)
        assert all(e["pid"] == rank and e["dur"] >= 0 for e in events if e["ph"] == "X")


def test_stall_is_reported_and_fails_after_shutdown_time():
    result = _job("""
        import sys, time
        bf.init()
        if bf.rank() == 0:
            try:
                bf.allreduce(tf.constant([1.0]), name="only_on_rank_0")
            except tf.errors.AbortedError as e:
                print("ABORTED:", e.message, flush=True)
                sys.exit(3)
        else:
            time.sleep(30)
        """, np=2, env={"BLUEFOG_STALL_CHECK_TIME": "1", "BLUEFOG_STALL_SHUTDOWN_TIME": "3"},
        timeout=60)
    out = result.output
    assert result.returncode != 0, out
    # The hang doctor's diagnosis (tests/python/test_hang_doctor.py has its cases).
    assert "WARNING: hang doctor: allreduce 'only_on_rank_0' has waited" in out, out
    assert "rank 1 never called allreduce 'only_on_rank_0'" in out, out
    # The flight recorder's pending list: what the waiting rank is stuck in, and since when.
    assert "What rank 0 has pending (bf.flight_recorder()):" in out, out
    assert re.search(r"allreduce 'only_on_rank_0' \(set 0, \d+ B float32\) queued \d", out), out
    assert "ABORTED:" in out and "BLUEFOG_STALL_SHUTDOWN_TIME=3" in out, out
    assert not result.timed_out and result.wall < 30, (
        f"the job took {result.wall:.0f} s: the stalled rank was not released")


def test_start_and_stop_timeline_at_run_time(tmp_path):
    """Horovod's start_timeline/stop_timeline: only the calls between them are recorded, one
    file per rank (rank 0 the given path), each complete JSON after stop_timeline; a second
    start replaces the first recording; an unwritable path is a clear error."""
    path = str(tmp_path / "tl.json")
    result = _job(f"""
        bf.init()
        bf.allreduce(tf.ones([4]), name="before")
        assert not bf.timeline_start_activity("step", "FORWARD")  # not recording yet
        bf.start_timeline({path!r})
        for step in range(2):
            with bf.timeline_context("step", "FORWARD"):
                bf.allreduce(tf.ones([4]), name="during")
        assert bf.timeline_start_activity("odd \\"x\\"", 'BACK"WARD')
        assert bf.timeline_end_activity("odd \\"x\\"")
        assert not bf.timeline_end_activity("never started")
        bf.stop_timeline()
        bf.allreduce(tf.ones([4]), name="after")
        bf.stop_timeline()  # nothing open: a no-op
        try:
            bf.start_timeline({str(tmp_path / "no" / "such" / "dir.json")!r})
        except bf.BluefogError as e:
            print("START FAILED:", e, flush=True)
        bf.shutdown()
        """, np=2, env={})
    assert result.returncode == 0, result.tail()
    assert "START FAILED:" in result.output and "cannot create" in result.output, result.tail()
    for rank, name in ((0, "tl.json"), (1, "tl.rank1.json")):
        events = json.load(open(tmp_path / name))
        tracks = {e["args"]["name"] for e in events if e.get("name") == "thread_name"}
        assert tracks == {"during", "step", 'odd "x"'}, (rank, tracks)
        assert all(e["pid"] == rank for e in events)
        names = [e["name"] for e in events if e["ph"] == "X"]
        assert names.count("FORWARD") == 2 and names.count('BACK"WARD') == 1, names


def test_eager_c_api_switched_off_takes_the_op():
    """BLUEFOG_EAGER_C_API=0: eager allreduces take the TensorFlow op (no call through the C
    API), with the same results; on by default."""
    code = """
        from bluefog.tensorflow import eager_calls
        bf.init()
        for k in range(3):
            got = bf.allreduce(tf.constant([bf.rank() + k, 1.0]), average=False, name="sw")
            assert got.numpy().tolist() == [1.0 + 2 * k, 2.0], got
        # One line, from rank 0 (two ranks' prints can interleave mid-line).
        calls = bf.allgather(tf.constant([eager_calls.calls()]), name="calls").numpy().tolist()
        if bf.rank() == 0:
            print("C API CALLS", calls, flush=True)
        """
    off = _job(code, np=2, env={"BLUEFOG_EAGER_C_API": "0"})
    assert off.returncode == 0, off.tail()
    assert "C API CALLS [0, 0]" in off.output, off.tail()
    on = _job(code, np=2, env={})
    assert on.returncode == 0, on.tail()
    assert "C API CALLS [3, 3]" in on.output, on.tail()
