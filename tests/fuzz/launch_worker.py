"""One process of a launch-fuzzer case (tests/fuzz/fuzz_launch.py), without TensorFlow.

``bf.init()`` (the C++ core through ``bluefog.common.basics``) from whatever the launcher and
the case's variables say, then one allreduce of ``rank + 1`` over ``LAUNCH_FUZZ_COUNT``
float32 elements through the core's eager call (the ``_eager`` extension of
csrc/tensorflow/eager_calls.cc, which runs the same request as the TensorFlow kernel). It
prints exactly one verdict line:

* ``LAUNCH OK rank R size S local L/LS sum X good G`` (G: every element equals X);
* ``LAUNCH ERROR <type>: <message>`` (on one line) and exits 3.

TensorFlow is not imported (its import costs seconds per process): the extension looks up
``tensorflow.errors`` once when it loads, so a stand-in module with the same error classes is
in ``sys.modules`` for that moment only.
"""

import os
import sys
import types

import numpy as np

from bluefog.common import basics, extension

_ERRORS = ("InvalidArgumentError", "FailedPreconditionError", "AbortedError", "InternalError",
           "ResourceExhaustedError")


# DataType::kFloat32 (csrc/core/types.h; op_rules.CORE_DTYPES lists them in this order).
FLOAT32 = 8


class OpError(Exception):
    """tf.errors.OpError's constructor: (node_def, op, message)."""

    def __init__(self, node_def, op, message):
        super().__init__(message)


def load_eager():
    errors = types.SimpleNamespace(**{n: type(n, (OpError,), {}) for n in _ERRORS})
    stand_in = types.ModuleType("tensorflow")
    stand_in.errors = errors
    saved = sys.modules.get("tensorflow")
    sys.modules["tensorflow"] = stand_in
    try:
        return extension.load_eager_extension()
    finally:
        if saved is None:
            del sys.modules["tensorflow"]
        else:
            sys.modules["tensorflow"] = saved


def main() -> int:
    count = int(os.environ.get("LAUNCH_FUZZ_COUNT", "5"))
    try:
        eager = load_eager()
        basics.init()
        rank, size = basics.rank(), basics.size()
        local = f"{basics.local_rank()}/{basics.local_size()}"
        data = np.full(count, rank + 1, dtype=np.float32)
        out = np.frombuffer(memoryview(eager.allreduce("launch.fuzz", FLOAT32, data, False)),
                            dtype=np.float32)
        total = float(out[0]) if count else 0.0
        good = bool(count == 0 or np.all(out == out[0]))
        print(f"LAUNCH OK rank {rank} size {size} local {local} sum {total:g} good {int(good)}",
              flush=True)
        basics.shutdown()
        return 0
    except Exception as e:  # noqa: BLE001 - the fuzzer judges the message
        text = " ".join(str(e).split())
        print(f"LAUNCH ERROR {type(e).__name__}: {text}", flush=True)
        return 3


if __name__ == "__main__":
    sys.exit(main())
