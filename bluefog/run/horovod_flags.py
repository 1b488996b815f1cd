"""``horovodrun``'s options, as ``bfrun`` understands them.

A Horovod launch line (``horovodrun -np 4 -H a:2,b:2 --fusion-threshold-mb 32 python train.py``)
runs unchanged with ``bfrun``. Each option either maps to what it means here (an mpirun
option or a ``BLUEFOG_*`` variable for every rank), or is accepted and ignored with a notice
that says why (``IGNORED``). With ``--gloo`` (and elastic ``--gloo``) the same options mean the
same: the same variables, the ssh options given to ssh, and a notice for what only mpirun does
(``GLOO_IGNORED``). Options bfrun already has under the same name (``-np``, ``-H``,
``--hostfile``, ``--timeline-filename``, ``-x``, ``--mpi-args``, ``--verbose``, the elastic
ones) are not repeated here.
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
from typing import Dict, List, Optional, Tuple

from bluefog.common.horovod_env import normalize_log_level

# Option dest -> why it has no effect here (printed when the option is given).
IGNORED: Dict[str, str] = {
    "start_timeout": "mpirun starts the ranks itself and has no start timeout",
    "autotune": "bluefog has no autotuner; set --fusion-threshold-mb / --cycle-time-ms",
    "autotune_log_file": "bluefog has no autotuner",
    "autotune_warmup_samples": "bluefog has no autotuner",
    "autotune_steps_per_sample": "bluefog has no autotuner",
    "autotune_bayes_opt_max_samples": "bluefog has no autotuner",
    "autotune_gaussian_process_noise": "bluefog has no autotuner",
    "timeline_mark_cycles": "the timeline has no cycle markers",
    "num_nccl_streams": "bluefog runs on CPUs: no NCCL",
    "thread_affinity": "use --mpi-args='--bind-to ...' to pin ranks",
    "mpi_threads_disable": "bluefog asks MPI for the thread level it needs",
    "log_with_timestamp": "log lines carry the rank, not a timestamp",
    "log_without_timestamp": "log lines carry the rank, not a timestamp",
    "tcp": "Open MPI chooses the transport; pass --mpi-args='--mca btl tcp,self' to force TCP",
    "mpi": "bfrun always starts the ranks with Open MPI's mpirun",
    "jsrun": "bfrun starts the ranks with mpirun (srun works too: docs/training.md)",
    "ccl_bgt_affinity": "no oneCCL",
}


# Why an option has no effect when bfrun starts the ranks itself (``--gloo``, elastic
# ``--gloo``): IGNORED's reasons that name mpirun replaced, and mpirun's own options added.
# Every other horovodrun option means there what it means on mpirun: the same BLUEFOG_*
# variable, or (``--ssh-port``, ``--ssh-identity-file``) the same ssh options.
GLOO_IGNORED: Dict[str, str] = {
    **IGNORED,
    "start_timeout": "bfrun --gloo starts the ranks without checks; the rendezvous waits "
                     "--gloo-timeout-seconds for them",
    "thread_affinity": "bfrun --gloo starts the ranks unpinned; pin them in the command "
                       "(taskset)",
    "mpi_threads_disable": "the Gloo backend does not use MPI",
    "tcp": "the Gloo backend always runs over TCP",
    "mpi": "--gloo starts the ranks without mpirun",
    "jsrun": "--gloo starts the ranks without jsrun or mpirun",
    "network_interface": "the Gloo backend connects from the interface whose route reaches "
                         "MASTER_ADDR",
    "output_filename": "bfrun --gloo prints every rank's output, tagged with its rank",
    "timestamp_output": "bfrun --gloo tags each line with its rank only",
    "binding_args": "bfrun --gloo starts the ranks unbound, without mpirun",
    "mpi_args": "bfrun --gloo starts the ranks without mpirun",
}
_FLAGS = {"timestamp_output": "--prefix-output-with-timestamp"}  # where not --DEST


def add_to(p: argparse.ArgumentParser) -> None:
    """Adds horovodrun's options that bfrun does not already have to the parser ``p``."""
    h = p.add_argument_group("horovodrun's options (docs/training.md, 'Coming from Horovod')")
    h.add_argument("-v", "--version", action="store_true", help="print bluefog's version")
    h.add_argument("-cb", "--check-build", dest="check_build", action="store_true",
                   help="print which frameworks, controllers and tensor operations are built")
    h.add_argument("-p", "--ssh-port", dest="ssh_port", type=tcp_port,
                   help="SSH port on the other hosts (mpirun's plm_rsh_args; with --gloo, "
                        "ssh -p)")
    h.add_argument("-i", "--ssh-identity-file", dest="ssh_identity_file",
                   help="SSH identity file for the other hosts (mpirun's plm_rsh_args; with "
                        "--gloo, ssh -i)")
    h.add_argument("--network-interface", "--network-interfaces", dest="network_interface",
                   help="comma-separated network interfaces to use (mpirun's "
                        "btl_tcp_if_include and oob_tcp_if_include; ignored with --gloo)")
    h.add_argument("--output-filename", dest="output_filename",
                   help="write each rank's output under this folder (mpirun's "
                        "--output-filename; ignored with --gloo)")
    h.add_argument("--log-level", dest="log_level",
                   help="bluefog's log level (trace, debug, info, warning, error, fatal; any "
                        "case): BLUEFOG_LOG_LEVEL")
    h.add_argument("--fusion-threshold-mb", dest="fusion_threshold_mb", type=float,
                   help="fusion buffer size in MiB: BLUEFOG_FUSION_THRESHOLD")
    h.add_argument("--cycle-time-ms", dest="cycle_time_ms", type=float,
                   help="background cycle time in ms: BLUEFOG_CYCLE_TIME")
    h.add_argument("--cache-capacity", dest="cache_capacity", type=int,
                   help="response cache capacity: BLUEFOG_CACHE_CAPACITY")
    h.add_argument("--disable-cache", dest="disable_cache", action="store_true",
                   help="no response cache: BLUEFOG_CACHE_CAPACITY=0")
    h.add_argument("--hierarchical-allreduce", dest="hierarchical_allreduce",
                   action="store_true", default=None,
                   help="BLUEFOG_HIERARCHICAL_ALLREDUCE=1")
    h.add_argument("--no-hierarchical-allreduce", dest="hierarchical_allreduce",
                   action="store_false", help="BLUEFOG_HIERARCHICAL_ALLREDUCE=0")
    h.add_argument("--no-stall-check", dest="no_stall_check", action="store_true",
                   help="no stall warnings: BLUEFOG_STALL_CHECK_TIME=0")
    h.add_argument("--stall-check-warning-time-seconds", dest="stall_warning", type=float,
                   help="BLUEFOG_STALL_CHECK_TIME")
    h.add_argument("--stall-check-shutdown-time-seconds", dest="stall_shutdown", type=float,
                   help="BLUEFOG_STALL_SHUTDOWN_TIME")
    h.add_argument("--gloo-timeout-seconds", dest="gloo_timeout_seconds", type=float,
                   help="BLUEFOG_GLOO_TIMEOUT")
    h.add_argument("--binding-args", dest="binding_args",
                   help="extra mpirun binding arguments, as one quoted string (ignored with "
                        "--gloo)")
    h.add_argument("--tag-output", dest="tag_output", action="store_true", default=True,
                   help="prefix each output line with its rank, as horovodrun does: "
                        "[1,RANK]<stdout>: (mpirun's --tag-output), [RANK]<stdout>: with "
                        "--gloo (the default)")
    h.add_argument("--no-tag-output", dest="tag_output", action="store_false",
                   help="print the ranks' output lines as they are, untagged")
    h.add_argument("--prefix-output-with-timestamp", dest="timestamp_output",
                   action="store_true", help="prefix each output line with the time "
                                             "(mpirun's --timestamp-output; ignored with "
                                             "--gloo)")
    h.add_argument("--config-file", dest="config_file",
                   help="Horovod's YAML config file (params, timeline, stall_check, "
                        "library_options); needs PyYAML")
    for dest, why in IGNORED.items():
        flag = "--" + dest.replace("_", "-")
        takes_value = dest not in ("autotune", "timeline_mark_cycles", "mpi_threads_disable",
                                   "log_with_timestamp", "log_without_timestamp", "tcp", "mpi",
                                   "jsrun")
        if takes_value:
            h.add_argument(flag, dest=dest, help=f"ignored: {why}")
        else:
            h.add_argument(flag, dest=dest, action="store_true", help=f"ignored: {why}")


def tcp_port(text: str) -> int:
    """argparse's type for a TCP port: 1 to 65535."""
    try:
        port = int(text)
    except ValueError:
        port = 0
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{text} is not a TCP port (1 to 65535)")
    return port


# Horovod's config-file keys (section, key) -> the bfrun option dest they set.
CONFIG_KEYS = {
    ("params", "fusion_threshold_mb"): "fusion_threshold_mb",
    ("params", "cycle_time_ms"): "cycle_time_ms",
    ("params", "cache_capacity"): "cache_capacity",
    ("params", "hierarchical_allreduce"): "hierarchical_allreduce",
    ("timeline", "filename"): "timeline",
    ("stall_check", "warning_time_seconds"): "stall_warning",
    ("stall_check", "shutdown_time_seconds"): "stall_shutdown",
    ("library_options", "log_level"): "log_level",
}


def read_config_file(path: str, args: argparse.Namespace) -> List[str]:
    """Sets the options of Horovod's YAML config file that the command line left unset;
    returns notices for the keys it ignores. Raises SystemExit with a clear message when the
    file cannot be read."""
    try:
        import yaml
    except ImportError:
        raise SystemExit("bfrun: --config-file needs PyYAML (pip install pyyaml), or pass the "
                         "settings as options (--fusion-threshold-mb, --cycle-time-ms, "
                         "...)") from None
    try:
        with open(path) as f:
            config = yaml.safe_load(f) or {}
    except (OSError, yaml.YAMLError) as e:
        raise SystemExit(f"bfrun: --config-file {path}: {e}") from None
    notices = []
    for section, values in config.items():
        if not isinstance(values, dict):
            notices.append(f"config {section}: ignored (not a section)")
            continue
        for key, value in values.items():
            dest = CONFIG_KEYS.get((section, key))
            if section == "stall_check" and key == "enabled" and value is False:
                args.no_stall_check = True
            elif dest is None:
                notices.append(f"config {section}.{key}: ignored (no counterpart here)")
            elif getattr(args, dest, None) is None:
                problem = _config_value_problem(dest, value)
                if problem:
                    raise SystemExit(f"bfrun: --config-file {path}: {section}.{key}: {value!r} "
                                     f"{problem}")
                setattr(args, dest, value)
    return notices


def _config_value_problem(dest: str, value) -> Optional[str]:
    """Why a config file's ``value`` for ``dest`` cannot be used, or None."""
    if dest == "hierarchical_allreduce":
        return None if isinstance(value, bool) else "is not true or false"
    if dest in ("timeline", "log_level"):
        return None if isinstance(value, str) and value else "is not a non-empty string"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "is not a number"
    if not math.isfinite(value):
        return "is not a finite number"
    if value < 0:
        return "is negative"
    if dest == "cache_capacity" and not isinstance(value, int):
        return "is not a whole number"
    return None


# horovodrun's options that take a number, by dest: each must be finite (nan, inf: refused).
_NUMBERS = {"fusion_threshold_mb": "--fusion-threshold-mb", "cycle_time_ms": "--cycle-time-ms",
            "stall_warning": "--stall-check-warning-time-seconds",
            "stall_shutdown": "--stall-check-shutdown-time-seconds",
            "gloo_timeout_seconds": "--gloo-timeout-seconds"}


def check(args: argparse.Namespace) -> Optional[str]:
    """What is wrong with horovodrun's numeric options in ``args``, or None. The ranks check
    the values that reach them (a negative size, say) and name the variable; a value that is
    not finite has no variable form and is refused here."""
    for dest, flag in _NUMBERS.items():
        value = getattr(args, dest, None)
        if value is not None and not math.isfinite(float(value)):
            return f"{flag} {value}: not a finite number"
    return None


def _set_variables(args: argparse.Namespace, env: Dict[str, str]) -> List[str]:
    """Sets the ``BLUEFOG_*`` variables of the horovodrun options in ``args`` (and of its
    config file) in ``env``, the same on every backend; returns the config file's notices."""
    notices = []
    if getattr(args, "config_file", None):
        notices += read_config_file(args.config_file, args)
    if args.fusion_threshold_mb is not None:
        env["BLUEFOG_FUSION_THRESHOLD"] = str(int(float(args.fusion_threshold_mb) * 1024 * 1024))
    if args.cycle_time_ms is not None:
        env["BLUEFOG_CYCLE_TIME"] = str(float(args.cycle_time_ms))
    if args.disable_cache:
        env["BLUEFOG_CACHE_CAPACITY"] = "0"
    elif args.cache_capacity is not None:
        env["BLUEFOG_CACHE_CAPACITY"] = str(int(args.cache_capacity))
    if args.hierarchical_allreduce is not None:
        env["BLUEFOG_HIERARCHICAL_ALLREDUCE"] = "1" if args.hierarchical_allreduce else "0"
    if args.no_stall_check:
        env["BLUEFOG_STALL_CHECK_TIME"] = "0"
    elif args.stall_warning is not None:
        env["BLUEFOG_STALL_CHECK_TIME"] = str(float(args.stall_warning))
    if args.stall_shutdown is not None:
        env["BLUEFOG_STALL_SHUTDOWN_TIME"] = str(float(args.stall_shutdown))
    if args.gloo_timeout_seconds is not None:
        env["BLUEFOG_GLOO_TIMEOUT"] = str(float(args.gloo_timeout_seconds))
    if args.log_level is not None:
        env["BLUEFOG_LOG_LEVEL"] = normalize_log_level(str(args.log_level))
    return notices


def _ssh_options(args: argparse.Namespace) -> List[str]:
    rsh = []
    if args.ssh_port is not None:
        rsh += ["-p", str(args.ssh_port)]
    if args.ssh_identity_file:
        rsh += ["-i", args.ssh_identity_file]
    return rsh


def _given(args: argparse.Namespace, dest: str) -> bool:
    return getattr(args, dest, None) not in (None, False, "")


def apply(args: argparse.Namespace, env: Dict[str, str]) -> Tuple[List[str], List[str]]:
    """The mpirun arguments for the horovodrun options in ``args`` and the notices to print;
    sets their ``BLUEFOG_*`` variables in ``env`` (forwarded to every rank)."""
    notices = _set_variables(args, env)
    mpi: List[str] = []
    rsh = _ssh_options(args)
    if rsh:
        mpi += ["--mca", "plm_rsh_args", " ".join(rsh)]
    if args.network_interface:
        mpi += ["--mca", "btl_tcp_if_include", args.network_interface,
                "--mca", "oob_tcp_if_include", args.network_interface]
    if args.output_filename:
        mpi += ["--output-filename", args.output_filename]
    if args.tag_output:
        mpi.append("--tag-output")
    if args.timestamp_output:
        mpi.append("--timestamp-output")
    if args.binding_args:
        mpi += shlex.split(args.binding_args)
    for dest, why in IGNORED.items():
        if _given(args, dest):
            notices.append(f"--{dest.replace('_', '-')}: ignored ({why})")
    return mpi, notices


def apply_gloo(args: argparse.Namespace, env: Dict[str, str]) -> List[str]:
    """``apply`` for ``bfrun --gloo`` and elastic ``--gloo``, which start the ranks without
    mpirun: sets the same ``BLUEFOG_*`` variables in ``env``, puts ``--ssh-port`` and
    ``--ssh-identity-file`` into the remote shell (``args.rsh_agent``) when that is ssh, and
    returns the notices to print: one "ignored (why)" per option given that has no effect."""
    notices = _set_variables(args, env)
    rsh = _ssh_options(args)
    if rsh:
        agent = args.rsh_agent or env.get("BLUEFOG_RSH_AGENT") or "ssh"
        words = shlex.split(agent)
        if words and os.path.basename(words[0]) == "ssh":
            args.rsh_agent = shlex.join(words + rsh)
        else:
            notices.append(f"--ssh-port, --ssh-identity-file: ignored (the remote shell is "
                           f"{agent!r}, not ssh: give them in --rsh-agent)")
    for dest, why in GLOO_IGNORED.items():
        if _given(args, dest):
            flag = _FLAGS.get(dest, f"--{dest.replace('_', '-')}")
            notices.append(f"{flag}: ignored ({why})")
    return notices


# Never forwarded: Open MPI's and the shell's own variables (forwarding OMPI_* of an outer
# mpirun breaks the inner one), and secrets, as horovodrun leaves them out.
_NOT_FORWARDED_PREFIXES = ("OMPI_", "PMIX_", "PMI_", "BASH_FUNC_", "SLURM_")
_NOT_FORWARDED = {"OLDPWD", "PWD", "HOSTNAME", "SHLVL", "_", "DISPLAY", "TERM", "SSH_AUTH_SOCK",
                  "SSH_CONNECTION", "SSH_CLIENT", "SSH_TTY"}


def exportable(name: str) -> bool:
    """Whether bfrun forwards the variable ``name`` to the ranks: every variable, as
    horovodrun does, except the launcher's and the shell's own and ``*_SECRET_KEY``."""
    return not (name in _NOT_FORWARDED or name.startswith(_NOT_FORWARDED_PREFIXES)
                or name.endswith("_SECRET_KEY"))


def version_text() -> str:
    """What ``bfrun --version`` prints."""
    try:
        from importlib.metadata import version
        return f"bluefog-tf {version('bluefog-tf')}"
    except Exception:  # not installed as a distribution (a source checkout)
        return "bluefog-tf (source checkout)"


def env_for_check_build() -> str:
    """What ``bfrun --check-build`` prints, in horovodrun's layout."""
    from bluefog.common import capabilities as c

    def box(flag):
        return "[X]" if flag() else "[ ]"

    return "\n".join([
        version_text() + ":", "", "Available Frameworks:", "    [X] TensorFlow",
        "    [ ] PyTorch", "    [ ] MXNet", "", "Available Controllers:",
        f"    {box(c.mpi_built)} MPI", f"    {box(c.gloo_built)} Gloo", "",
        "Available Tensor Operations:", f"    {box(c.nccl_built)} NCCL",
        f"    {box(c.ddl_built)} DDL", f"    {box(c.ccl_built)} CCL",
        f"    {box(c.mpi_built)} MPI", f"    {box(c.gloo_built)} Gloo", ""])

