"""Every horovodrun option bfrun accepts means the same on every backend (bluefog/run/
horovod_flags.py): mapped to the same BLUEFOG_* variable (or ssh option) on mpirun, bfrun --gloo
and elastic --gloo, or announced on one line as "ignored (why)". Real bfrun runs whose ranks
print what they see (no TensorFlow, no init); each run has a timeout."""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from typing import Dict, List, Optional, Sequence

import pytest

from bluefog.run import bfrun, horovod_flags

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TIMEOUT_S = 120
BACKENDS = {  # how each backend starts 2 ranks
    "mpirun": ["-np", "2"],
    "gloo": ["--gloo", "-np", "2"],
    "elastic-gloo": ["--gloo", "-np", "2", "--min-np", "1"],
}
SHOW = ("import os, sys\n"  # one write per line: mpirun tags each write
        "for k, v in sorted(os.environ.items()):\n"
        "    if k.startswith(('BLUEFOG_', 'FAKE_SSH')):\n"
        "        sys.stdout.write('SEES %s=%s\\n' % (k, v.strip().replace(' ', ',')))\n")

# (options, the variable each rank sees, its value)
MAPPED = [
    (["--fusion-threshold-mb", "32"], "BLUEFOG_FUSION_THRESHOLD", "33554432"),
    (["--cycle-time-ms", "2.5"], "BLUEFOG_CYCLE_TIME", "2.5"),
    (["--log-level", "FATAL"], "BLUEFOG_LOG_LEVEL", "error"),
    (["--gloo-timeout-seconds", "45"], "BLUEFOG_GLOO_TIMEOUT", "45.0"),
    (["--cache-capacity", "7"], "BLUEFOG_CACHE_CAPACITY", "7"),
    (["--disable-cache"], "BLUEFOG_CACHE_CAPACITY", "0"),
    (["--hierarchical-allreduce"], "BLUEFOG_HIERARCHICAL_ALLREDUCE", "1"),
    (["--no-hierarchical-allreduce"], "BLUEFOG_HIERARCHICAL_ALLREDUCE", "0"),
    (["--no-stall-check"], "BLUEFOG_STALL_CHECK_TIME", "0"),
    (["--stall-check-warning-time-seconds", "9"], "BLUEFOG_STALL_CHECK_TIME", "9.0"),
    (["--stall-check-shutdown-time-seconds", "20"], "BLUEFOG_STALL_SHUTDOWN_TIME", "20.0"),
]
# Options handled outside horovod_flags' tables, each tested elsewhere in this file (the config
# file, ssh) or by test_bfrun.py / test_gloo_launch.py (output tags, version and build).
HANDLED = {"version", "check_build", "tag_output", "config_file", "ssh_port",
           "ssh_identity_file"}
# mpirun's own options: passed to mpirun there (test_bfrun.py checks the command line),
# "ignored (why)" without it.
MPIRUN_OPTIONS = {"network_interface": ["--network-interface", "eth0"],
                  "output_filename": ["--output-filename", "out"],
                  "timestamp_output": ["--prefix-output-with-timestamp"],
                  "binding_args": ["--binding-args=--bind-to core"],
                  "mpi_args": ["--mpi-args=--mca btl self"]}


def _horovod_actions() -> List[argparse.Action]:
    parser = bfrun._parser()
    group = next(g for g in parser._action_groups if g.title.startswith("horovodrun's"))
    return [a for a in group._group_actions if a.dest != "help"]


def _ignored_flags(table: Dict[str, str]) -> List[List[str]]:
    flags = {a.dest: a for a in _horovod_actions()}
    out = []
    for dest in table:
        if dest in MPIRUN_OPTIONS:
            out.append(MPIRUN_OPTIONS[dest])
            continue
        action = flags[dest]
        out.append([action.option_strings[0]] + ([] if action.nargs == 0 else ["1"]))
    return out


def run_bfrun(args: Sequence[str],
              env: Optional[Dict[str, str]] = None) -> subprocess.CompletedProcess:
    full = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=REPO)
    full = {k: v for k, v in full.items() if not k.startswith(("OMPI_", "PMIX_", "PMI_"))}
    full.update(env or {})
    return subprocess.run([sys.executable, "-m", "bluefog.run", *args], capture_output=True,
                          text=True, timeout=TIMEOUT_S, cwd=REPO, env=full)


def seen(result: subprocess.CompletedProcess) -> List[str]:
    return re.findall(r"SEES (\S+)", result.stdout)


def _skip_without(backend: str) -> None:
    if backend == "mpirun" and shutil.which("mpirun") is None:
        pytest.skip("mpirun not installed")


def test_every_option_is_mapped_or_ignored_with_a_reason():
    """No horovodrun option bfrun accepts is left out of this file's tables or the
    launcher's: a new one must say what it means on every backend."""
    mapped = {a.dest for a in _horovod_actions()
              if any(a.option_strings[0] == opts[0] for opts, _, _ in MAPPED)}
    for action in _horovod_actions():
        d = action.dest
        assert (d in mapped or d in HANDLED or d in horovod_flags.IGNORED
                or d in MPIRUN_OPTIONS), f"{action.option_strings}: not covered"
        if d not in mapped and d not in HANDLED:
            assert d in horovod_flags.GLOO_IGNORED, f"{action.option_strings}: no --gloo reason"


@pytest.mark.parametrize("backend", list(BACKENDS))
@pytest.mark.parametrize("options,variable,value", MAPPED, ids=[m[0][0] for m in MAPPED])
def test_mapped_option_reaches_every_rank(backend, options, variable, value):
    _skip_without(backend)
    result = run_bfrun([*BACKENDS[backend], *options, sys.executable, "-c", SHOW])
    assert result.returncode == 0, result.stderr[-3000:]
    assert seen(result).count(f"{variable}={value}") == 2, result.stdout + result.stderr
    assert "ignored" not in result.stderr, result.stderr


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_ignored_options_say_why_on_every_backend(backend):
    """Each option with no effect prints one "bfrun: --OPTION: ignored (why)" line, with the
    reason of that backend; the ranks still run."""
    _skip_without(backend)
    table = horovod_flags.IGNORED if backend == "mpirun" else horovod_flags.GLOO_IGNORED
    for options in _ignored_flags(table):
        run = ([*BACKENDS[backend], "--dry-run"] if backend == "mpirun"
               else BACKENDS[backend])
        result = run_bfrun([*run, *options, sys.executable, "-c", SHOW])
        assert result.returncode == 0, (options, result.stderr[-3000:])
        flag = options[0].split("=")[0]
        dest = next(a.dest for a in _horovod_actions() + [argparse.Action(["--mpi-args"],
                                                                          "mpi_args")]
                    if flag in a.option_strings)
        notice = f"bfrun: {flag}: ignored ({table[dest]})"
        assert result.stderr.count(notice) == 1, (notice, result.stderr)


@pytest.fixture
def fake_ssh(tmp_path):
    """A folder with an `ssh` that takes -p PORT and -i FILE, then runs the command here; the
    rank it starts sees the options it got in FAKE_SSH_OPTIONS."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    ssh = bin_dir / "ssh"
    ssh.write_text('#!/bin/sh\nopts=""\nwhile [ $# -gt 0 ]; do\n  case "$1" in\n'
                   '    -p|-i) opts="$opts $1 $2"; shift 2;;\n    *) break;;\n  esac\ndone\n'
                   'shift\nexec env -i PATH="$PATH" HOME="$HOME" FAKE_SSH_OPTIONS="$opts" '
                   'sh -c "$*"\n')
    ssh.chmod(0o755)
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}


@pytest.mark.parametrize("backend", ["gloo", "elastic-gloo"])
def test_ssh_port_and_identity_reach_the_remote_shell(backend, fake_ssh):
    """-p/-i go to ssh for a rank on another host, as mpirun's plm_rsh_args does; a remote
    shell that is not ssh gets them announced as ignored."""
    hosts = ["-H", "localhost:1,elsewhere:1"]
    result = run_bfrun([*BACKENDS[backend], *hosts, "-p", "2222", "-i", "/keys/id", sys.executable,
                        "-c", SHOW], env=fake_ssh)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "FAKE_SSH_OPTIONS=-p,2222,-i,/keys/id" in seen(result), result.stdout
    assert "ignored" not in result.stderr, result.stderr
    agent = os.path.join(REPO, "tests", "python", "fake_rsh.sh")
    result = run_bfrun([*BACKENDS[backend], *hosts, "--rsh-agent", agent, "-p", "2222",
                        sys.executable, "-c", SHOW], env=fake_ssh)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "bfrun: --ssh-port, --ssh-identity-file: ignored (the remote shell is" in result.stderr


def test_ssh_port_and_identity_on_mpirun():
    if shutil.which("mpirun") is None:
        pytest.skip("mpirun not installed")
    result = run_bfrun(["--dry-run", "-np", "2", "-p", "2222", "-i", "/keys/id", "python", "x"])
    assert "--mca plm_rsh_args '-p 2222 -i /keys/id'" in result.stderr, result.stderr


def test_timeline_filename_on_elastic_gloo_says_why_it_is_ignored(tmp_path):
    result = run_bfrun([*BACKENDS["elastic-gloo"], "--timeline-filename", str(tmp_path / "t"),
                        sys.executable, "-c", SHOW])
    assert result.returncode == 0, result.stderr[-3000:]
    assert "bfrun: --timeline-filename: ignored (in-place elastic training renumbers" in (
        result.stderr)


@pytest.mark.parametrize("backend", [[], ["--gloo"]])
@pytest.mark.parametrize("flag", ["--fusion-threshold-mb", "--cycle-time-ms",
                                  "--gloo-timeout-seconds"])
@pytest.mark.parametrize("value", ["nan", "inf"])
def test_a_number_that_is_not_finite_is_refused_with_the_option(backend, flag, value):
    """The launch fuzzer's --fusion-threshold-mb nan ended bfrun in a ValueError traceback."""
    result = subprocess.run([sys.executable, "-m", "bluefog.run", *backend, "-np", "2", flag,
                             value, sys.executable, "-c", "pass"], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    assert f"bfrun: {flag} {value}: not a finite number" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr, result.stderr


CONFIG = """params:
  fusion_threshold_mb: 32
  cycle_time_ms: 2.5
  hierarchical_allreduce: true
stall_check:
  warning_time_seconds: 9
library_options:
  log_level: FATAL
autotune:
  enabled: true
"""


@pytest.mark.parametrize("backend", ["mpirun", "gloo"])
def test_config_file_values_reach_every_rank_and_the_command_line_wins(backend, tmp_path):
    _skip_without(backend)
    path = tmp_path / "horovod.yaml"
    path.write_text(CONFIG)
    result = run_bfrun([*BACKENDS[backend], "--config-file", str(path), "--cycle-time-ms", "7",
                        sys.executable, "-c", SHOW])
    assert result.returncode == 0, result.stderr
    for variable, value in [("BLUEFOG_FUSION_THRESHOLD", "33554432"),
                            ("BLUEFOG_CYCLE_TIME", "7.0"),
                            ("BLUEFOG_HIERARCHICAL_ALLREDUCE", "1"),
                            ("BLUEFOG_STALL_CHECK_TIME", "9.0"), ("BLUEFOG_LOG_LEVEL", "error")]:
        assert seen(result).count(f"{variable}={value}") == 2, (variable, result.stdout)
    assert "config autotune.enabled: ignored (no counterpart here)" in result.stderr


@pytest.mark.parametrize("line,problem", [
    ("params:\n  fusion_threshold_mb: .nan\n", "params.fusion_threshold_mb: nan is not a finite"),
    ("params:\n  cycle_time_ms: .inf\n", "params.cycle_time_ms: inf is not a finite number"),
    ("params:\n  cycle_time_ms: fast\n", "params.cycle_time_ms: 'fast' is not a number"),
    ("params:\n  fusion_threshold_mb: -4\n", "params.fusion_threshold_mb: -4 is negative"),
    ("params:\n  cache_capacity: 2.5\n", "params.cache_capacity: 2.5 is not a whole number"),
    ("params:\n  hierarchical_allreduce: 3\n",
     "params.hierarchical_allreduce: 3 is not true or false"),
    ("stall_check:\n  warning_time_seconds: yes\n",
     "stall_check.warning_time_seconds: True is not a number"),
])
def test_config_file_value_that_cannot_be_used_is_refused(tmp_path, line, problem):
    """A config file's nan once reached int(float(...)) and ended bfrun in a traceback."""
    path = tmp_path / "horovod.yaml"
    path.write_text(line)
    args = bfrun._parser().parse_args(["-np", "2", "--config-file", str(path), "true"])
    with pytest.raises(SystemExit) as refused:
        horovod_flags.apply(args, {})
    assert f"bfrun: --config-file {path}: {problem}" in str(refused.value)


@pytest.mark.parametrize("flag,value", [("--gloo-port", "70000"), ("--gloo-port", "0"),
                                        ("--ssh-port", "x")])
def test_a_port_out_of_range_is_refused(flag, value, capsys):
    """--gloo-port 70000 was taken modulo 65536 without a word."""
    with pytest.raises(SystemExit):
        bfrun._parser().parse_args(["--gloo", flag, value, "-np", "2", "true"])
    assert f"{value} is not a TCP port (1 to 65535)" in capsys.readouterr().err
