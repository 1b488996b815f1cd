"""What the window tests share: each rank's value, reading a receive buffer back, and an error
check that the message names this rank, the op and the window."""

import numpy as np
import pytest

import bluefog.tensorflow as bf

SHAPE = (2, 3)


def value(r, dtype=np.float32):
    return (np.arange(6).reshape(SHAPE) + 10.0 * r + 1).astype(dtype)


def buffer(name, src):
    """This rank's receive buffer for in-neighbour `src` (resets its version to 0)."""
    return bf.win_update(name, self_weight=0.0, neighbor_weights={src: 1.0}, clone=True).numpy()


def buffers(name):
    return {s: buffer(name, s) for s in bf.in_neighbor_ranks()}


def raises(exc, op, name, match=None):
    """pytest.raises that also checks the message names this rank, `op` and window `name`."""
    class Check:
        def __enter__(self):
            self.ctx = pytest.raises(exc, match=match)
            self.info = self.ctx.__enter__()
            return self.info

        def __exit__(self, *a):
            out = self.ctx.__exit__(*a)
            msg = str(self.info.value)
            for part in (f"rank {bf.rank()}", op, repr(name) if name else ""):
                assert part in msg, f"{part!r} not in {msg!r}"
            return out

    return Check()
