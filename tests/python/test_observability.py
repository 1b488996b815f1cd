"""Timeline files and stall handling, each in a job of its own (they are configured at init)."""

import glob
import json
import time

from mpi_job import run_job


def test_timeline_is_valid_chrome_trace_per_rank(tmp_path):
    prefix = str(tmp_path / "timeline.")
    result = run_job("""
        bf.init()
        for step in range(3):
            bf.allreduce(tf.ones([10]), name="grad/w")
            bf.allgather(tf.ones([bf.rank() + 1]), name='odd "name"')
            bf.broadcast(tf.ones([2]), root_rank=0, name="bcast")
        bf.shutdown()
        """, np=2, env={"BLUEFOG_TIMELINE": prefix})
    assert result.returncode == 0, result.stdout
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
    start = time.monotonic()
    result = run_job("""
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
    elapsed = time.monotonic() - start
    out = result.stdout
    assert result.returncode != 0, out
    assert "WARNING: a collective submitted on this rank has waited" in out, out
    assert "'only_on_rank_0'" in out, out
    assert "ABORTED:" in out and "BLUEFOG_STALL_SHUTDOWN_TIME=3" in out, out
    assert elapsed < 30, f"the job took {elapsed:.0f} s: the stalled rank was not released"
