"""``bluefog.run(fn, ...)``: run a Python function on N processes of a Gloo job (Horovod's
``horovod.run``) and return every rank's result.

The function and its arguments travel to the ranks pickled with cloudpickle (so lambdas and
closures work), base64-encoded in an environment variable; each rank's result or exception
comes back on its standard output as one line tagged with a random per-job marker, which the
caller takes out of the forwarded output. So nothing listens besides rank 0's rendezvous
store, and other hosts need no shared folder.
"""

from __future__ import annotations

import base64
import os
import sys
from typing import Any, Callable, Dict, List, Optional, Sequence

import cloudpickle

from bluefog.run import gloo_launch
from bluefog.run.bfrun import forwarded_env

PAYLOAD_VAR = "BLUEFOG_RUN_PAYLOAD"
MARKER_VAR = "BLUEFOG_RUN_MARKER"
# One environment string is limited to 128 KiB on Linux (MAX_ARG_STRLEN).
MAX_PAYLOAD_BYTES = 96 * 1024


class _Stream:
    """Writes bytes to a text or binary stream (pytest's capture has no .buffer sometimes)."""

    def __init__(self, stream):
        self.stream = stream

    def write(self, data: bytes) -> None:
        buf = getattr(self.stream, "buffer", None)
        if buf is not None:
            buf.write(data)
        else:
            self.stream.write(data.decode(errors="replace"))

    def flush(self) -> None:
        self.stream.flush()


def run(fn: Callable[..., Any], args: Sequence[Any] = (), kwargs: Optional[Dict[str, Any]] = None,
        np: int = 1, hosts: Optional[str] = None, env: Optional[Dict[str, str]] = None,
        timeout: Optional[float] = None, rsh_agent: Optional[str] = None,
        executable: Optional[str] = None, use_gloo: Optional[bool] = None,
        use_mpi: Optional[bool] = None) -> List[Any]:
    """Runs ``fn(*args, **kwargs)`` on `np` processes and returns their results in rank order.

    Each process is a rank of a Gloo job (``bluefog.tensorflow.init()`` inside `fn` joins it).
    `hosts` is ``"host1:slots,host2:slots"`` as for ``bfrun -H`` (default: this machine); other
    hosts are reached with `rsh_agent` (default ``$BLUEFOG_RSH_AGENT``, else ssh) and need the
    same Python (`executable`, default this one) and bluefog. `env` replaces the environment
    the ranks inherit. Each rank's output is printed prefixed with ``[rank]<stdout>:`` (or
    ``<stderr>``), as ``horovod.run`` prints it.

    `use_gloo` and `use_mpi` are Horovod's: the ranks always run on Gloo here, so
    ``use_mpi=True`` (without ``use_gloo=True``) raises ValueError; start such a job with
    ``bfrun -np N python script.py`` instead.

    Raises RuntimeError naming the rank when a rank raises (the rank's exception is its cause)
    or dies, after ending the other ranks; TimeoutError after `timeout` seconds.
    """
    if use_mpi and not use_gloo:
        raise ValueError("bluefog.run: use_mpi=True: bluefog.run starts its ranks on Gloo, "
                         "not MPI; pass use_gloo=True (or neither), or start the script on MPI "
                         "with `bfrun -np N python script.py`")
    payload = base64.b64encode(cloudpickle.dumps((fn, tuple(args), dict(kwargs or {})))).decode()
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise ValueError(
            f"bluefog.run: the pickled function and arguments take {len(payload)} bytes, more "
            f"than {MAX_PAYLOAD_BYTES} (they travel in an environment variable); pass large "
            f"data as a file path and read it inside the function")
    marker = "bluefog-run-result-" + os.urandom(8).hex()
    base = dict(os.environ if env is None else env)
    base[PAYLOAD_VAR] = payload
    base[MARKER_VAR] = marker
    results: Dict[int, tuple] = {}
    tag = marker.encode() + b" "

    def on_line(rank: int, is_err: bool, line: bytes) -> bool:
        if is_err or not line.startswith(tag):
            return False
        results[rank] = cloudpickle.loads(base64.b64decode(line[len(tag):].strip()))
        return True

    command = [executable or sys.executable, "-m", "bluefog.run.task"]
    job = gloo_launch.launch(command, np, hosts, base, (PAYLOAD_VAR, MARKER_VAR), rsh_agent,
                             forwarded_env=forwarded_env, on_line=on_line,
                             out=_Stream(sys.stdout), err=_Stream(sys.stderr))
    try:
        code, failed, msg = job.wait(timeout)
    except BaseException:
        job.terminate()
        raise
    if code == 124 and failed is None:
        raise TimeoutError(f"bluefog.run: {msg}")
    for rank in range(np):
        outcome = results.get(rank)
        if outcome is not None and outcome[0] == "error":
            _, exc, text = outcome
            raise RuntimeError(f"bluefog.run: rank {rank} raised {text}") from exc
    if code != 0:
        raise RuntimeError(f"bluefog.run: {msg}")
    missing = [r for r in range(np) if r not in results]
    if missing:
        raise RuntimeError(f"bluefog.run: rank(s) {missing} exited without returning a result "
                           f"(did the function call os._exit or sys.exit?)")
    return [results[r][1] for r in range(np)]
