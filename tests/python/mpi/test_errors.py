"""Error reporting: argument errors raised locally, disagreements between ranks, names in flight.

Every error test ends with a normal collective that must succeed, so an error that leaves the
runtime in a bad state (or a request behind) fails the test that caused it.
"""

import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import tensorflow as tf

import bluefog.tensorflow as bf

from conftest import needs_ranks


@pytest.fixture
def op_name(request):
    return "te." + request.node.name


def _check_next_op_works(name, rank, size):
    """A normal collective right after an error: it must succeed with the right value."""
    out = bf.allreduce(tf.constant([float(rank), 1.0]), average=False, name=name + ".after")
    np.testing.assert_allclose(out.numpy(), [size * (size - 1) / 2, size])


def _run_graph(build):
    """Builds a graph with build() and runs its result in a Session."""
    graph = tf.Graph()
    with graph.as_default():
        fetches = build()
    config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=4,
                                      intra_op_parallelism_threads=1)
    with tf.compat.v1.Session(graph=graph, config=config) as sess:
        return sess.run(fetches)


def _call(mode, fn):
    """fn() eagerly, inside a tf.function, or in a graph run by a Session."""
    if mode == "eager":
        return fn()
    if mode == "function":
        return tf.function(fn)()
    return _run_graph(fn)


# --------------------------------------------------------------- disagreements between ranks


def _mismatch_case(kind, rank, name):
    """The collective for `kind`: rank 0 differs from the other ranks in one respect.

    Returns (call, words): call() issues it; the error message must contain every word.
    """
    first = rank == 0
    if kind == "shape":
        t = tf.zeros([2] if first else [3])
        return lambda: bf.allreduce(t, name=name), ["shape", "rank 0 has [2]", "has [3]"]
    if kind == "broadcast-shape":
        t = tf.zeros([2, 2] if first else [2, 3])
        return (lambda: bf.broadcast(t, root_rank=0, name=name),
                ["shape", "rank 0 has [2, 2]", "has [2, 3]"])
    if kind == "allgather-shape":
        t = tf.zeros([1, 2] if first else [1, 3])
        return lambda: bf.allgather(t, name=name), ["shape", "[2]", "[3]"]
    if kind == "dtype":
        t = tf.zeros([4], tf.float32 if first else tf.int32)
        return (lambda: bf.allreduce(t, average=False, name=name),
                ["dtype", "rank 0 has float32", "has int32"])
    if kind == "op":
        t = tf.zeros([2])
        if first:
            return lambda: bf.allreduce(t, name=name), ["allreduce", "allgather"]
        return lambda: bf.allgather(t, name=name), ["allreduce", "allgather"]
    if kind == "root_rank":
        t = tf.zeros([3])
        return (lambda: bf.broadcast(t, root_rank=0 if first else 1, name=name),
                ["root rank", "rank 0 has 0", "has 1"])
    raise AssertionError(kind)


@needs_ranks(2)
@pytest.mark.parametrize("mode", ["eager", "graph"])
@pytest.mark.parametrize(
    "kind", ["shape", "broadcast-shape", "allgather-shape", "dtype", "op", "root_rank"])
def test_mismatch_fails_on_every_rank(kind, mode, rank, size, op_name):
    if mode == "graph":
        graph = tf.Graph()
        with graph.as_default():
            call, words = _mismatch_case(kind, rank, op_name)
            out = call()
        with tf.compat.v1.Session(graph=graph) as sess:
            with pytest.raises(tf.errors.FailedPreconditionError) as info:
                sess.run(out)
    else:
        call, words = _mismatch_case(kind, rank, op_name)
        with pytest.raises(tf.errors.FailedPreconditionError) as info:
            call()
    message = str(info.value)
    assert op_name in message, message  # names the tensor
    for word in words:
        assert word in message, (word, message)
    for r in range(1, size):  # every rank that differs from rank 0 is listed
        assert f"rank {r} has" in message, message
    _check_next_op_works(op_name, rank, size)


@needs_ranks(2)
def test_mismatch_in_function_after_good_op(rank, size, op_name):
    """A bad request after a good one in one tf.function: the call fails, later ops work.

    The bad request's input depends on the good one's result, so it is submitted only after the
    good one completed on this rank; two independent ones could race (if the failure came first,
    TensorFlow might never start the good one on some rank while others wait for it).
    """
    bad = tf.zeros([2] if rank == 0 else [5])

    @tf.function
    def fn():
        good = bf.allreduce(tf.ones([3]), average=False, name=op_name + ".good")
        return bf.allreduce(bad + 0 * tf.reduce_sum(good), name=op_name + ".bad")

    with pytest.raises(tf.errors.FailedPreconditionError, match=r"\.bad"):
        fn()
    _check_next_op_works(op_name, rank, size)


@needs_ranks(2)
def test_repeated_mismatches_then_success(rank, size, op_name):
    """The runtime keeps working after many failed requests in a row."""
    for i in range(5):
        with pytest.raises(tf.errors.FailedPreconditionError):
            bf.allreduce(tf.zeros([rank + 1]), name=f"{op_name}.{i}")
    _check_next_op_works(op_name, rank, size)


@needs_ranks(2)
@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("op", ["grouped_allreduce", "grouped_reducescatter"])
def test_group_size_mismatch_fails_on_every_rank(op, mode, rank, size, op_name):
    """Rank 0 passes one tensor more (or, repeated with a second call, fewer) than the others:
    every rank gets an error naming the group's sizes, none waits for the tensor that only some
    ranks sent, and the same name works again afterwards."""
    call = {"grouped_allreduce": lambda ts, name: bf.grouped_allreduce(ts, name=name),
            "grouped_reducescatter": lambda ts, name: bf.grouped_reducescatter(ts, name=name)}[op]
    for extra in (1, -1):
        n = 3 + (extra if rank == 0 else 0)
        tensors = [tf.ones([size, 2]) * (i + 1) for i in range(n)]
        with pytest.raises(tf.errors.FailedPreconditionError) as info:
            _call(mode, lambda: call(tensors, op_name))  # noqa: B023
        message = str(info.value)
        assert "number of tensors in the group" in message, message
        assert f"rank 0 has {3 + extra}" in message and "rank 1 has 3" in message, message
        assert f"rank {rank}:" in message and op_name in message, message
    outs = call([tf.ones([size, 2]) * (i + 1) for i in range(3)], op_name)
    for i, out in enumerate(outs):
        np.testing.assert_allclose(out.numpy(), np.full(out.shape, i + 1.0))
    _check_next_op_works(op_name, rank, size)


# --------------------------------------------------------------------- local argument errors


@pytest.mark.parametrize("dtype", [tf.string, tf.complex64], ids=lambda d: d.name)
@pytest.mark.parametrize("op", ["allreduce", "allgather", "broadcast"])
def test_unsupported_dtype(op, dtype, rank, size, op_name):
    t = tf.zeros([2], dtype)
    call = {"allreduce": lambda: bf.allreduce(t, name=op_name),
            "allgather": lambda: bf.allgather(t, name=op_name),
            "broadcast": lambda: bf.broadcast(t, root_rank=0, name=op_name)}[op]
    with pytest.raises(TypeError) as info:
        call()
    message = str(info.value)
    assert op in message and op_name in message and dtype.name in message, message
    _check_next_op_works(op_name, rank, size)


def test_bool_allreduce_is_rejected(rank, size, op_name):
    with pytest.raises(TypeError, match="allreduce") as info:
        bf.allreduce(tf.constant([True, False]), name=op_name)
    assert op_name in str(info.value)
    _check_next_op_works(op_name, rank, size)


@pytest.mark.parametrize("mode", ["eager", "function", "graph"])
def test_root_rank_out_of_range(mode, rank, size, op_name):
    for root in (-1, size, size + 3):
        with pytest.raises(ValueError, match=rf"root_rank {root}\b") as info:
            # The lambda runs within this iteration (B023 does not apply).
            _call(mode, lambda: bf.broadcast(tf.ones([2]), root_rank=root,  # noqa: B023
                                             name=op_name))
        assert op_name in str(info.value)
    _check_next_op_works(op_name, rank, size)


def test_root_rank_not_an_int(rank, size, op_name):
    for root in (0.0, "0", None, True):
        with pytest.raises(TypeError, match="root_rank"):
            bf.broadcast(tf.ones([2]), root_rank=root, name=op_name)
    _check_next_op_works(op_name, rank, size)


@pytest.mark.parametrize("op", ["allreduce", "allgather", "broadcast"])
def test_bad_name(op, rank, size, op_name):
    t = tf.ones([2])
    for bad in (5, b"bytes", "", ["x"]):
        # Called within this iteration (B023 does not apply).
        call = {"allreduce": lambda: bf.allreduce(t, name=bad),  # noqa: B023
                "allgather": lambda: bf.allgather(t, name=bad),  # noqa: B023
                "broadcast": lambda: bf.broadcast(t, root_rank=0, name=bad)}[op]  # noqa: B023
        with pytest.raises(ValueError, match="name"):
            call()
    _check_next_op_works(op_name, rank, size)


@pytest.mark.parametrize("op", ["allreduce", "allgather", "broadcast"])
def test_non_tensor_input(op, rank, size, op_name):
    call = {"allreduce": lambda: bf.allreduce(object(), name=op_name),
            "allgather": lambda: bf.allgather(object(), name=op_name),
            "broadcast": lambda: bf.broadcast(object(), root_rank=0, name=op_name)}[op]
    with pytest.raises(TypeError) as info:
        call()
    assert op in str(info.value) and op_name in str(info.value)
    _check_next_op_works(op_name, rank, size)


@pytest.mark.parametrize("mode", ["eager", "function", "graph"])
def test_allgather_of_scalar(mode, rank, size, op_name):
    with pytest.raises(ValueError, match="rank >= 1") as info:
        _call(mode, lambda: bf.allgather(tf.constant(1.0), name=op_name))
    assert op_name in str(info.value)
    _check_next_op_works(op_name, rank, size)


def test_allgather_of_scalar_with_unknown_rank_in_graph(rank, size, op_name):
    """The static check cannot see the rank: the kernel rejects the scalar on every rank."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, shape=None)
        out = bf.allgather(x, name=op_name)
    with tf.compat.v1.Session(graph=graph) as sess:
        with pytest.raises(tf.errors.InvalidArgumentError, match="rank >= 1") as info:
            sess.run(out, feed_dict={x: 1.0})
        assert op_name in str(info.value)
        # The same graph still works with a valid input.
        result = sess.run(out, feed_dict={x: [float(rank)]})
    np.testing.assert_array_equal(result, np.arange(size, dtype=np.float32))
    _check_next_op_works(op_name, rank, size)


# --------------------------------------------------------------------------- name in flight


@needs_ranks(2)
def test_name_already_in_flight(rank, size, op_name):
    """A second request with the name of one still in flight fails on that rank only.

    Two collectives with one name in one Session.run or tf.function would race: if the first
    completes before the second is submitted, the second becomes a fresh request that the other
    ranks never match, and that rank hangs. So the test makes it deterministic:

    - rank 0 submits "dup" twice at once, from two threads (one a graph-mode Session.run, the
      other eager). Whichever comes second fails at once with InvalidArgumentError; the first
      stays in flight, because the other ranks have not submitted "dup" yet.
    - the other ranks submit "dup" only after a "gate" allreduce, which rank 0 joins only after
      it has seen the failure. Then rank 0's remaining "dup" completes with the right sum.
    """
    dup = op_name + ".dup"
    gate = op_name + ".gate"
    value = np.array([rank + 1.0, 2.0], np.float32)
    expected = [size * (size + 1) / 2, 2.0 * size]

    if rank == 0:
        outcomes = {}

        def via_session():
            try:
                outcomes["session"] = _run_graph(lambda: bf.allreduce(
                    tf.constant(value), average=False, name=dup))
            except Exception as e:  # recorded and checked below
                outcomes["session"] = e

        def via_eager():
            try:
                outcomes["eager"] = bf.allreduce(tf.constant(value), average=False,
                                                 name=dup).numpy()
            except Exception as e:
                outcomes["eager"] = e

        threads = [threading.Thread(target=via_session, daemon=True),
                   threading.Thread(target=via_eager, daemon=True)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60
        while len(outcomes) < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(outcomes) == 1, f"expected exactly one request to fail at once: {outcomes}"
        (loser, error), = outcomes.items()
        assert isinstance(error, tf.errors.InvalidArgumentError), (loser, error)
        assert "already in flight" in str(error) and dup in str(error), str(error)
        winner = "eager" if loser == "session" else "session"

        bf.allreduce(tf.constant(1.0), name=gate)  # lets the other ranks submit "dup"
        for t in threads:
            t.join(60)
        assert not isinstance(outcomes[winner], Exception), outcomes[winner]
        np.testing.assert_allclose(np.asarray(outcomes[winner]), expected)
    else:
        bf.allreduce(tf.constant(1.0), name=gate)
        out = bf.allreduce(tf.constant(value), average=False, name=dup)
        np.testing.assert_allclose(out.numpy(), expected)
    _check_next_op_works(op_name, rank, size)


def test_name_in_flight_check_is_per_rank_and_frees_the_name(rank, size, op_name):
    """After a request completes, its name can be reused at once (sequential reuse is fine)."""
    for i in range(3):
        out = bf.allreduce(tf.constant([float(rank + i)]), average=False, name=op_name)
        np.testing.assert_allclose(out.numpy(), [size * (size - 1) / 2 + size * i])


# ----------------------------------------------------------------------- before bf.init()

_BEFORE_INIT_SCRIPT = r"""
import json, os
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import tensorflow as tf
import bluefog.tensorflow as bf
assert not bf.is_initialized()
report = {}
calls = {
    "allreduce": lambda: bf.allreduce(tf.ones([2]), name="x"),
    "allgather": lambda: bf.allgather(tf.ones([2]), name="x"),
    "broadcast": lambda: bf.broadcast(tf.ones([2]), root_rank=0, name="x"),
    "rank": lambda: bf.rank(),
    "size": lambda: bf.size(),
}
for what, call in calls.items():
    try:
        call()
        report[what] = None
    except Exception as e:
        report[what] = [type(e).__name__, str(e)]
print("REPORT " + json.dumps(report))
"""


def test_ops_before_init_tell_to_call_init(rank, size, op_name):
    """In a fresh process that never called bf.init() (a singleton, outside mpirun)."""
    if rank == 0:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("OMPI_", "PMIX_", "PMI_", "OPAL_", "PRTE_"))}
        proc = subprocess.run([sys.executable, "-c", _BEFORE_INIT_SCRIPT], env=env,
                              capture_output=True, text=True, timeout=120,
                              cwd=os.path.dirname(os.path.dirname(os.path.dirname(
                                  os.path.dirname(os.path.abspath(__file__))))))
        lines = [line for line in proc.stdout.splitlines() if line.startswith("REPORT ")]
        assert proc.returncode == 0 and lines, (proc.returncode, proc.stdout, proc.stderr[-3000:])
        import json
        report = json.loads(lines[-1][len("REPORT "):])
        for what, outcome in report.items():
            assert outcome is not None, f"{what} succeeded before bf.init()"
            assert "bf.init()" in outcome[1], (what, outcome)
        for op in ("allreduce", "allgather", "broadcast"):
            assert op in report[op][1] and "'x'" in report[op][1], report[op]
    _check_next_op_works(op_name, rank, size)


def _in_forked_child(body):
    """Runs body() in a child made with os.fork(); returns what it returned (a str), or the
    exception it raised as "TypeName: message"."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never back into pytest
        try:
            try:
                result = str(body())
            except BaseException as e:  # noqa: BLE001 - reported to the parent
                result = f"{type(e).__name__}: {e}"
            os.write(write_end, result.encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as f:
        result = f.read().decode()
    os.waitpid(pid, 0)
    return result


@pytest.mark.parametrize("call", ["allreduce", "broadcast_object", "win_create", "init",
                                  "shutdown"])
def test_a_forked_child_is_refused_and_the_parent_carries_on(call, rank, size, op_name):
    calls = {
        "allreduce": lambda: bf.allreduce(tf.constant([1.0]), name=op_name).numpy(),
        "broadcast_object": lambda: bf.broadcast_object("x", root_rank=0, name=op_name),
        "win_create": lambda: bf.win_create(tf.constant([1.0]), name=op_name),
        "init": bf.init,
        "shutdown": bf.shutdown,  # what interpreter exit runs: a no-op in the child
    }
    result = _in_forked_child(calls[call])
    if call == "shutdown":
        assert result == "None", result
    else:
        what = "init" if call == "init" else None
        assert result.startswith(("FailedPreconditionError", "BluefogError")), result
        assert f"rank {rank}: bluefog {what or ''}" in result, result
        assert f"a fork of process {os.getpid()} which called bf.init()" in result, result
        assert "Call bluefog only in the process that called bf.init()" in result, result
        if call == "allreduce":
            assert f"bluefog allreduce of tensor '{op_name}'" in result, result
    _check_next_op_works(op_name, rank, size)
    assert bf.is_initialized()
