"""Eager calls of the collectives: run on the calling thread from several Python threads at
once, through TensorFlow's eager fast path, and through the wrapper's lean path for a name seen
before, which must leave every check and error of the full path in place."""

import threading

import numpy as np
import pytest
import tensorflow as tf

import bluefog.tensorflow as bf

from conftest import needs_ranks


@pytest.fixture
def op_name(request):
    """A request name unique to this test, identical on every rank."""
    return "ec." + request.node.name


def test_eager_collectives_from_several_threads(rank, size, op_name):
    """Eager calls may run their collective on the calling thread (BLUEFOG_EAGER_INLINE), through
    the op or through the C API (eager_calls): with three Python threads calling at once, each
    in its own order, every result must still be right, whichever thread ended up running the
    rounds."""
    results, errors = {}, []

    def worker(t):
        try:
            for k in range(15):
                x = tf.constant([rank + k + 10.0 * t] * (k + 1))
                for _ in range(2):  # the second call of a name goes through the C API
                    s = bf.allreduce(x, average=False, name=f"{op_name}.{t}.s{k}").numpy()
                g = bf.allgather(tf.constant([[rank, k]]), name=f"{op_name}.{t}.g{k}").numpy()
                b = bf.broadcast(tf.constant([rank * 1.0, k]), root_rank=k % size,
                                 name=f"{op_name}.{t}.b{k}").numpy()
                results[(t, k)] = (s, g, b)
        except Exception as e:  # reported below, with the thread's name
            errors.append(f"thread {t}: {e}")

    threads = [threading.Thread(target=worker, args=(t,), daemon=True) for t in range(3)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    assert not errors, errors
    assert not any(th.is_alive() for th in threads), "an eager collective did not finish"
    for (t, k), (s, g, b) in results.items():
        np.testing.assert_array_equal(s, [size * (k + 10.0 * t) + size * (size - 1) / 2] * (k + 1))
        np.testing.assert_array_equal(g, [[r, k] for r in range(size)])
        np.testing.assert_array_equal(b, [k % size, k])
    assert len(results) == 45


def test_eager_calls_take_tensorflows_fast_path(rank, size, op_name, monkeypatch):
    """TensorFlow's eager fast path refuses some attribute values (an int for a float
    attribute) and then re-runs the op through a slow fallback, 30-100 us more per call: every
    eager call of the collectives must take the fast path."""
    from tensorflow.python import pywrap_tfe

    fast = pywrap_tfe.TFE_Py_FastPathExecute
    refused = []

    def spy(*args):
        try:
            return fast(*args)
        except Exception as e:
            if type(e).__name__ == "_FallbackException":
                refused.append(f"{args[1]}: {e}")
            raise

    monkeypatch.setattr(pywrap_tfe, "TFE_Py_FastPathExecute", spy)
    x = tf.constant([1.0, 2.0])
    for _ in range(2):  # the second call of a name takes the lean path (op_library.eager_name)
        bf.allreduce(x, name=f"{op_name}.a")
        bf.allgather(x, name=f"{op_name}.e2")
    bf.allreduce(x, average=False, op=bf.Max, name=f"{op_name}.b")
    bf.allreduce(tf.constant([1.0], tf.float64), prescale_factor=0.5, name=f"{op_name}.c")
    bf.grouped_allreduce([x, x * 2], name=f"{op_name}.d")
    bf.allgather(x, name=f"{op_name}.e")
    bf.broadcast(x, 0, name=f"{op_name}.f")
    bf.barrier()
    bf.neighbor_allreduce(x, name=f"{op_name}.g")
    assert not refused, refused


def test_eager_lean_path_checks_what_the_full_path_checks(rank, size, op_name):
    """A name's second eager call skips the wrapper's checks (op_library.eager_name) only when
    every argument is one the checks would pass: other calls of the same name still get the full
    path's errors, and the same name inside a tf.function still builds a graph op that does not
    run inline."""
    from bluefog.tensorflow import op_library

    x = tf.constant([rank + 1.0, 2.0])
    name = f"{op_name}.r"
    for average in (False, True, False):
        got = bf.allreduce(x, average=average, name=name).numpy()
        total = size * (size + 1) / 2
        np.testing.assert_allclose(got, [total / size if average else total,
                                         2.0 if average else 2.0 * size])
    assert op_library.eager_name(x, name, "allreduce") is not None, "the lean path was not taken"
    # A dtype the op refuses, under a name the lean path knows: the full path's error.
    with pytest.raises(TypeError, match=rf"rank {rank}: bluefog allreduce of tensor '{name}'"):
        bf.allreduce(tf.constant([True]), name=name)
    with pytest.raises(TypeError, match="average must be a bool"):
        bf.allreduce(x, average=1, name=name)
    # A graph: eager_inline stays off (the kernel joins one round at most, never drives until
    # done: the executor must not be blocked by one op).
    fn = tf.function(lambda: bf.allreduce(x, average=False, name=name))
    graph = fn.get_concrete_function().graph
    ops = [o for o in graph.get_operations() if o.type == "BluefogAllreduce"]
    assert ops and not any(o.get_attr("eager_inline") for o in ops)
    np.testing.assert_allclose(fn().numpy(), [size * (size + 1) / 2, 2.0 * size])

    g = f"{op_name}.g"
    for _ in range(2):
        np.testing.assert_array_equal(bf.allgather(tf.constant([[rank]]), name=g).numpy(),
                                      [[r] for r in range(size)])
    # A scalar under a known name: still the full path's error, not the op's.
    with pytest.raises(ValueError, match=rf"rank {rank}: bluefog allgather of tensor '{g}'"):
        bf.allgather(tf.constant(rank), name=g)


# ------------------------------------------ eager allreduces through the C API (eager_calls)


def _both_paths(call):
    """call() through the C API and through the TensorFlow op (under a gradient tape, which
    every call leaves to the op), with the number of C API calls the first made."""
    from bluefog.tensorflow import eager_calls

    before = eager_calls.calls()
    direct = call()
    taken = eager_calls.calls() - before
    with tf.GradientTape():
        through_op = call()
    assert eager_calls.calls() - before == taken, "a recorded call went through the C API"
    return direct, through_op, taken


@pytest.mark.parametrize("dtype", [tf.float32, tf.float64, tf.float16, tf.bfloat16, tf.int32,
                                   tf.int64, tf.uint8], ids=lambda d: d.name)
def test_direct_eager_allreduce_matches_the_op(dtype, rank, size, op_name):
    """A name's later eager allreduces run through the C API (no TensorFlow op dispatch): the
    same bits as the op, for every shape (scalar, matrix, an output block of 1 MiB and more with
    an odd element count), sum and average, and the result is a CPU tensor of the input's dtype
    and shape."""
    for shape in ([], [3, 5], [(1 << 20) // dtype.size + 7]):
        n = int(np.prod(shape)) if shape else 1
        x = tf.cast(tf.reshape(tf.range(n) % 5 + rank + 1, shape), dtype)
        for average in (False, True):
            name = f"{op_name}.{len(shape)}.{average}"
            bf.allreduce(x, average=average, name=name)  # the first call of a name: the op
            direct, through_op, taken = _both_paths(
                lambda x=x, a=average, nm=name: bf.allreduce(x, average=a, name=nm))
            assert taken == 1, f"shape {shape}: the C API path was not taken"
            assert direct.dtype == dtype and direct.shape == x.shape, direct
            assert direct.device.endswith("CPU:0"), direct.device
            np.testing.assert_array_equal(direct.numpy(), through_op.numpy())
            if not average:
                want = (np.arange(n) % 5).reshape(shape) * size + size * (size + 1) // 2
                np.testing.assert_array_equal(direct.numpy().astype(np.float64), want)


def test_direct_eager_allreduce_with_horovods_op_argument(rank, size, op_name):
    """Horovod's way of asking for a sum or a mean, ``op=bf.Sum`` / ``op=bf.Average`` (the
    constants or their strings), takes the C API path as ``average=`` does, on a name's first
    call and later ones, with the same results; ``op`` decides over ``average``. Other ops
    keep the TensorFlow op."""
    from bluefog.tensorflow import eager_calls

    x = tf.constant([rank + 1.0, 2.0 * rank])
    total = np.array([size * (size + 1) / 2, size * (size - 1)])
    for op, average, want in ((bf.Sum, True, total), (bf.Average, False, total / size),
                              ("sum", True, total), ("average", True, total / size)):
        name = f"{op_name}.{op}.{average}"
        for call in range(2):
            before = eager_calls.calls()
            got = bf.allreduce(x, average=average, op=op, name=name).numpy()
            assert eager_calls.calls() == before + 1, f"op={op!r}, call {call}: not the C API"
            np.testing.assert_allclose(got, want, rtol=1e-6)
    before = eager_calls.calls()
    got = bf.allreduce(x, op=bf.Max, name=f"{op_name}.max").numpy()
    assert eager_calls.calls() == before, "op=bf.Max went through the C API"
    np.testing.assert_array_equal(got, [size, 2.0 * (size - 1)])


def test_direct_eager_outputs_are_reused_blocks(rank, size, op_name):
    """An output of 1 MiB or more is an output block of the core, shared with the tensor (not
    copied): each result held keeps its own block, and a dropped result's block is handed out
    again, so a loop of calls touches no fresh memory."""
    import gc

    x = tf.fill([1 << 18], float(rank + 1))

    def address(t):
        return t._numpy().__array_interface__["data"][0]

    bf.allreduce(x, average=False, name=op_name)
    held = [bf.allreduce(x, average=False, name=op_name) for _ in range(3)]
    addresses = [address(t) for t in held]
    assert len(set(addresses)) == 3, addresses
    assert all(a % 4096 == 0 for a in addresses), addresses  # blocks, page-aligned
    for t in held:
        np.testing.assert_array_equal(t.numpy(), size * (size + 1) / 2)
    del held, t
    gc.collect()
    again = [address(bf.allreduce(x, average=False, name=op_name)) for _ in range(3)]
    assert set(again) <= set(addresses), (again, addresses)


@needs_ranks(2)
@pytest.mark.parametrize("kind", ["shape", "dtype"])
def test_direct_eager_mismatch_fails_on_every_rank(kind, rank, size, op_name):
    """A mismatch under a name every rank has used before (so the call goes through the C API):
    the op's error on every rank, naming the tensor and each rank's value, and the next call
    works."""
    from bluefog.tensorflow import eager_calls

    good = tf.zeros([2])
    bf.allreduce(good, average=False, name=op_name)
    if kind == "shape":
        bad, words = tf.zeros([2] if rank == 0 else [3]), ["shape", "rank 0 has [2]", "has [3]"]
    else:
        bad = tf.zeros([2], tf.float32 if rank == 0 else tf.int32)
        words = ["dtype", "rank 0 has float32", "has int32"]
    before = eager_calls.calls()
    with pytest.raises(tf.errors.FailedPreconditionError) as info:
        bf.allreduce(bad, average=False, name=op_name)
    assert eager_calls.calls() == before + 1, "the C API path was not taken"
    message = str(info.value)
    assert op_name in message and "allreduce" in message, message
    for word in words:
        assert word in message, (word, message)
    np.testing.assert_array_equal(
        bf.allreduce(tf.fill([2], float(rank)), average=False, name=op_name).numpy(),
        [size * (size - 1) / 2] * 2)


def test_direct_eager_leaves_recorded_calls_to_the_op(rank, size, op_name):
    """Under a gradient tape the call takes the op, so that the tape records it: the gradient of
    a summed allreduce is the sum of the ranks' upstream gradients."""
    from bluefog.tensorflow import eager_calls

    x = tf.constant([1.0, 2.0])
    bf.allreduce(x, average=False, name=op_name)
    before = eager_calls.calls()
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = bf.allreduce(x, average=False, name=op_name)
    assert eager_calls.calls() == before, "a recorded call went through the C API"
    np.testing.assert_array_equal(tape.gradient(y, x).numpy(), [size, size])


def test_direct_eager_unnamed_calls_and_traced_captures(rank, size):
    """Unnamed eager allreduces go through the C API too (after the full path's checks); an
    eager tensor captured while a tf.function is traced builds the op instead, and runs it on
    every call of the function."""
    from bluefog.tensorflow import eager_calls

    x = tf.constant([rank + 1.0, 1.0])
    before = eager_calls.calls()
    got = bf.allreduce(x, average=False).numpy()
    assert eager_calls.calls() == before + 1, "the C API path was not taken"
    np.testing.assert_array_equal(got, [size * (size + 1) / 2, size])
    fn = tf.function(lambda: bf.allreduce(x, average=False))
    graph = fn.get_concrete_function().graph
    assert [o for o in graph.get_operations() if o.type == "BluefogAllreduce"]
    for _ in range(2):
        np.testing.assert_array_equal(fn().numpy(), [size * (size + 1) / 2, size])
    assert eager_calls.calls() == before + 1, "a traced call went through the C API"


def test_direct_eager_scalars_from_several_threads(rank, size, op_name):
    """Scalars through the C API from four threads at once: a scalar tensor's ``_numpy()`` is a
    numpy scalar, whose ``__array_interface__`` points into a temporary copy; read after that
    copy was freed, the threads' inputs got mixed up (caught by the stress run)."""
    from concurrent.futures import ThreadPoolExecutor

    def job(it, k):
        x = tf.constant(np.float64(rank * 10 + k + it))
        return bf.allreduce(x, average=False, name=f"{op_name}.{it}.{k}").numpy()

    with ThreadPoolExecutor(4) as pool:
        for it in range(30):
            futures = [pool.submit(job, it, k) for k in range(6)]
            for k, f in enumerate(futures):
                got = f.result(timeout=120)
                assert got.shape == () and got == size * (k + it) + 10 * size * (size - 1) // 2, \
                    (it, k, got)
