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
import shlex
import sys
import warnings
from typing import Any, Callable, Dict, List, Optional, Sequence

import cloudpickle

from bluefog.run import gloo_launch
from bluefog.run.bfrun import forwarded_env

PAYLOAD_VAR = "BLUEFOG_RUN_PAYLOAD"
MARKER_VAR = "BLUEFOG_RUN_MARKER"
# One environment string is limited to 128 KiB on Linux (MAX_ARG_STRLEN).
MAX_PAYLOAD_BYTES = 96 * 1024


def _resolve_np(np_: Optional[int], num_proc: Optional[int]) -> int:
    if np_ is not None and num_proc is not None and np_ != num_proc:
        raise ValueError(f"bluefog.run: np={np_} and num_proc={num_proc} disagree; give one")
    n = np_ if np_ is not None else (num_proc if num_proc is not None else 1)
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"bluefog.run: the number of processes must be an integer >= 1, "
                         f"got {n!r}")
    return n


def hosts_from_hostfile(path: str) -> str:
    """``host1:N,host2:M`` from an Open MPI / Horovod hostfile (``host slots=N`` per line;
    blank lines and ``#`` comments skipped; no ``slots=`` means 1)."""
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise ValueError(f"bluefog.run: cannot read hostfile {path!r}: {e}") from None
    hosts = []
    for number, line in enumerate(lines, 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        slots = 1
        for word in words[1:]:
            key, _, value = word.partition("=")
            if key in ("slots", "max_slots", "max-slots") and value.isdigit():
                slots = int(value) if key == "slots" else slots
            else:
                raise ValueError(f"bluefog.run: hostfile {path!r} line {number}: expected "
                                 f"'host slots=N', got {line.strip()!r}")
        hosts.append(f"{words[0]}:{slots}")
    if not hosts:
        raise ValueError(f"bluefog.run: hostfile {path!r} names no host")
    return ",".join(hosts)


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


def _same(name: str, value: Optional[int], horovod_name: str,
          horovod_value: Optional[int]) -> Optional[int]:
    if value is not None and horovod_value is not None and value != horovod_value:
        raise ValueError(f"bluefog.run: {name}={value} and {horovod_name}={horovod_value} "
                         f"disagree; give one")
    return value if value is not None else horovod_value


def _run_elastic(command: List[str], np: Optional[int], min_np: Optional[int],
                 max_np: Optional[int], hosts: Optional[str], discovery: Optional[str],
                 env: Dict[str, str], rsh_agent: Optional[str], on_line,
                 results: Dict[Any, tuple], reset_limit: Optional[int] = None,
                 cooldown_range: Any = None) -> List[Any]:
    """Runs the job under bfrun's in-place elastic driver (bluefog/run/gloo_elastic.py) and
    returns the results of the workers of its last round, in rank order."""
    from bluefog.run import bfrun, elastic_driver, gloo_elastic

    argv = ["--gloo"]
    for flag, value in (("-np", np), ("--min-np", min_np if min_np is not None else 1),
                        ("--max-np", max_np), ("-H", hosts),
                        ("--host-discovery-script", discovery), ("--rsh-agent", rsh_agent),
                        ("--reset-limit", reset_limit)):
        if value is not None:
            argv += [flag, str(value)]
    if cooldown_range is not None:
        low, high = cooldown_range
        argv += ["--blacklist-cooldown-range", str(low), str(high)]
    if hosts is None and discovery is None:
        argv += ["-H", f"localhost:{max_np or np or min_np or 1}"]
    args = bfrun._parser().parse_args(argv + command)
    problem = elastic_driver.check_args(args)
    if problem:
        raise ValueError(f"bluefog.run (elastic, as bfrun's options): {problem}")
    driver = gloo_elastic.GlooElasticDriver(args, env, [PAYLOAD_VAR, MARKER_VAR],
                                            forwarded_env)
    driver.on_line = lambda wid, is_err, line: on_line(wid, is_err, line)
    sys.stdout.flush()
    sys.stderr.flush()
    code = driver.run()
    members = driver.members
    for wid in members + sorted(set(results) - set(members)):
        outcome = results.get(wid)
        if outcome is not None and outcome[0] == "error":
            _, exc, text = outcome
            where = (f"rank {members.index(wid)} (worker {wid})" if wid in members
                     else f"worker {wid}")
            raise RuntimeError(f"bluefog.run: {where} raised {text}") from exc
    if code != 0:
        raise RuntimeError(f"bluefog.run: the elastic job failed (status {code}; the driver's "
                           f"last lines above say why)")
    missing = [r for r, w in enumerate(members) if w not in results]
    if missing:
        raise RuntimeError(f"bluefog.run: rank(s) {missing} exited without returning a result "
                           f"(did the function call os._exit or sys.exit?)")
    return [results[w][1] for w in members]


def run(fn: Callable[..., Any], args: Sequence[Any] = (), kwargs: Optional[Dict[str, Any]] = None,
        np: Optional[int] = None, hosts: Optional[str] = None,
        env: Optional[Dict[str, str]] = None, timeout: Optional[float] = None,
        rsh_agent: Optional[str] = None, executable: Optional[str] = None, *,
        num_proc: Optional[int] = None, hostfile: Optional[str] = None,
        start_timeout: Optional[float] = None, ssh_port: Optional[int] = None,
        ssh_identity_file: Optional[str] = None, disable_cache: Optional[bool] = None,
        use_gloo: Optional[bool] = None, use_mpi: Optional[bool] = None,
        mpi_args: Optional[str] = None, verbose: Optional[int] = None,
        output_filename: Optional[str] = None, network_interface: Optional[str] = None,
        network_interfaces: Optional[str] = None, min_num_proc: Optional[int] = None,
        max_num_proc: Optional[int] = None, min_np: Optional[int] = None,
        max_np: Optional[int] = None, slots: Optional[int] = None,
        reset_limit: Optional[int] = None, cooldown_range: Any = None,
        host_discovery_script: Optional[str] = None) -> List[Any]:
    """Runs ``fn(*args, **kwargs)`` on `np` processes and returns their results in rank order.

    Each process is a rank of a Gloo job (``bluefog.tensorflow.init()`` inside `fn` joins it).
    `hosts` is ``"host1:slots,host2:slots"`` as for ``bfrun -H`` (default: this machine); other
    hosts are reached with `rsh_agent` (default ``$BLUEFOG_RSH_AGENT``, else ssh) and need the
    same Python (`executable`, default this one) and bluefog. `env` replaces the environment
    the ranks inherit. Each rank's output is printed prefixed with ``[rank]<stdout>:`` (or
    ``<stderr>``), as ``horovod.run`` prints it.

    Horovod's ``horovod.run`` arguments are accepted under its names: `num_proc` (= `np`,
    default 1), `hostfile` (lines ``host slots=N``), `start_timeout` (seconds the ranks wait
    for each other at the rendezvous: ``BLUEFOG_GLOO_TIMEOUT``), `ssh_port` and
    `ssh_identity_file` (added to ssh), `disable_cache` (``BLUEFOG_CACHE_CAPACITY=0``),
    `use_gloo`. `use_mpi=True` and `mpi_args` are refused (this function always starts a Gloo
    job; launch an MPI job with ``bfrun``).

    Elastic jobs: with `min_num_proc` (or `min_np`), `max_num_proc` (`max_np`) or
    `host_discovery_script`, the job runs as ``bfrun --gloo --min-np`` runs it (docs: elastic
    training): `np` workers at first (default: every slot, up to `max_num_proc`), on `hosts`
    or the hosts the script prints (``host:slots`` lines); a lost worker leaves and the others
    go on in place (`fn` uses ``bf.elastic.run``), down to `min_num_proc` (default 1); new
    slots join. It returns the results of the workers of the last round, in rank order.
    `reset_limit` (the most times the job may re-form) and `cooldown_range` (``(min, max)``
    seconds a host where a worker failed gets no new worker; default: for good) are bfrun's
    ``--reset-limit`` and ``--blacklist-cooldown-range``. `slots` is refused (the hosts give
    each host's slots as ``host:slots``).
    `verbose`, `output_filename` and `network_interface(s)` are accepted and have no effect
    (a warning says so).

    Raises RuntimeError naming the rank when a rank raises (the rank's exception is its cause)
    or dies, after ending the other ranks; TimeoutError after `timeout` seconds.
    """
    np_given = np is not None or num_proc is not None
    np = _resolve_np(np, num_proc)
    if use_mpi or use_gloo is False or mpi_args:
        raise ValueError("bluefog.run always starts a Gloo job (no mpirun); use_mpi=True, "
                         "use_gloo=False and mpi_args have no meaning here: launch an MPI job "
                         "with `bfrun -np N python train.py` instead")
    if slots is not None:
        raise ValueError("bluefog.run: slots: not supported: give each host's slots in hosts "
                         "(\"host1:4,host2:4\") or as the discovery script's host:slots lines")
    min_np = _same("min_np", min_np, "min_num_proc", min_num_proc)
    max_np = _same("max_np", max_np, "max_num_proc", max_num_proc)
    elastic = any(v is not None for v in (min_np, max_np, host_discovery_script, reset_limit,
                                          cooldown_range))
    if hostfile is not None:
        if hosts is not None:
            raise ValueError("bluefog.run: give hosts or hostfile, not both")
        hosts = hosts_from_hostfile(hostfile)
    ignored = {"verbose": verbose, "output_filename": output_filename,
               "network_interface": network_interface, "network_interfaces": network_interfaces}
    for name, value in ignored.items():
        if value is not None:
            warnings.warn(f"bluefog.run: {name}={value!r} has no effect here (the ranks' output "
                          f"is printed tagged by rank; Gloo connects over the interface of the "
                          f"address each host resolves to)", stacklevel=2)
    if rsh_agent is None and (ssh_port is not None or ssh_identity_file):
        rsh_agent = "ssh" + (f" -p {int(ssh_port)}" if ssh_port is not None else "") + (
            f" -i {shlex.quote(ssh_identity_file)}" if ssh_identity_file else "")
    base = dict(os.environ if env is None else env)
    if start_timeout is not None:
        base["BLUEFOG_GLOO_TIMEOUT"] = str(float(start_timeout))
    if disable_cache:
        base["BLUEFOG_CACHE_CAPACITY"] = "0"
    payload = base64.b64encode(cloudpickle.dumps((fn, tuple(args), dict(kwargs or {})))).decode()
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise ValueError(
            f"bluefog.run: the pickled function and arguments take {len(payload)} bytes, more "
            f"than {MAX_PAYLOAD_BYTES} (they travel in an environment variable); pass large "
            f"data as a file path and read it inside the function")
    marker = "bluefog-run-result-" + os.urandom(8).hex()
    base[PAYLOAD_VAR] = payload
    base[MARKER_VAR] = marker
    results: Dict[int, tuple] = {}
    tag = marker.encode() + b" "

    def on_line(rank: int, is_err: bool, line: bytes) -> Optional[bytes]:
        # The result may follow output the function left without a newline on the same line:
        # that output is printed, the result taken.
        at = -1 if is_err else line.find(tag)
        if at < 0:
            return None
        results[rank] = cloudpickle.loads(base64.b64decode(line[at + len(tag):].strip()))
        return line[:at]

    command = [executable or sys.executable, "-m", "bluefog.run.task"]
    if elastic:
        return _run_elastic(command, np if np_given else None, min_np, max_np, hosts,
                            host_discovery_script, base, rsh_agent, on_line, results,
                            reset_limit, cooldown_range)
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
