"""bfrun, end to end: it launches real ranks with mpirun (plain pytest, not under mpirun)."""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BFRUN = [sys.executable, "-m", "bluefog.run"]
needs_mpirun = pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun not installed")


def bfrun(args, env=None, timeout=120):
    full_env = dict(os.environ)
    full_env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    full_env.update(env or {})
    return subprocess.run(BFRUN + args, capture_output=True, text=True, timeout=timeout,
                          cwd=REPO, env=full_env)


RANK_SCRIPT = """
import tensorflow as tf
tf.config.threading.set_intra_op_parallelism_threads(1)
import bluefog.tensorflow as bf
bf.init()
total = int(bf.allreduce(tf.constant(bf.rank() + 1), average=False).numpy())
import sys
sys.stdout.write(f"rank {bf.rank()} of {bf.size()} total {total}\\n")  # one write: no interleaving
sys.stdout.flush()
"""


@needs_mpirun
def test_two_ranks_run_a_collective():
    result = bfrun(["-np", "2", sys.executable, "-c", RANK_SCRIPT], timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    # Tagged by rank as horovodrun tags its output (mpirun's --tag-output), by default.
    for r in range(2):
        assert re.search(rf"^\[\d+,{r}\]<stdout>:rank {r} of 2 total 3$", result.stdout, re.M), \
            result.stdout + result.stderr[-3000:]


@needs_mpirun
def test_console_script_if_installed():
    script = os.path.join(os.path.dirname(sys.executable), "bfrun")
    if not os.path.exists(script):
        pytest.skip("the bfrun console script is not installed next to this python")
    program = ("import os, sys; "
               "sys.stdout.write('hello %s\\n' % os.environ['OMPI_COMM_WORLD_RANK'])")
    result = subprocess.run([script, "-np", "2", "--no-tag-output", sys.executable, "-c",
                             program], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    assert sorted(result.stdout.splitlines()) == ["hello 0", "hello 1"], result.stdout


@needs_mpirun
def test_failing_rank_makes_bfrun_fail():
    code = "import os, sys; sys.exit(3 if os.environ['OMPI_COMM_WORLD_RANK'] == '1' else 0)"
    result = bfrun(["-np", "2", sys.executable, "-c", code])
    assert result.returncode != 0


@needs_mpirun
def test_environment_and_timeline_reach_the_ranks():
    code = ("import os, sys; e = os.environ; sys.stdout.write('env %s %s %s\\n' % ("
            "e.get('BLUEFOG_TIMELINE'), e.get('BLUEFOG_TEST_VALUE'), e.get('MY_SETTING')))")
    result = bfrun(["-np", "2", "--timeline-filename", "/tmp/bf_timeline", "-x", "MY_SETTING=on",
                    sys.executable, "-c", code], env={"BLUEFOG_TEST_VALUE": "42"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("env /tmp/bf_timeline 42 on") == 2, result.stdout


def test_missing_mpirun_gives_install_hint(tmp_path):
    # A PATH without mpirun (the python is called by its absolute path).
    result = bfrun(["-np", "2", "python", "-c", "pass"], env={"PATH": str(tmp_path)})
    assert result.returncode != 0
    assert "mpirun was not found" in result.stderr
    assert "apt-get install openmpi-bin" in result.stderr


@needs_mpirun
def test_dry_run_shows_the_mpirun_command(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("localhost slots=4\n")
    result = bfrun(["--dry-run", "-np", "4", "-H", "localhost:4", "--hostfile", str(hostfile),
                    "--mpi-args=--tag-output", "python", "train.py", "--epochs", "3"])
    assert result.returncode == 0, result.stderr
    line = result.stderr.strip().splitlines()[-1]
    for part in ("-np 4", "--bind-to none", "--oversubscribe", "-H localhost:4",
                 f"--hostfile {hostfile}", "--tag-output", "-x PATH",
                 "python train.py --epochs 3"):
        assert part in line, line
    if os.geteuid() == 0:
        assert "--allow-run-as-root" in line
    # Other hosts: keepalive settings, so a lost host ends the job in seconds, not minutes.
    assert "--mca oob_tcp_keepalive_time 10" in line, line
    assert "--mca oob_tcp_keepalive_probes 3" in line, line


def test_keepalive_defaults_only_with_hosts_and_never_over_the_users():
    local = bfrun(["--dry-run", "-np", "2", "python", "train.py"])
    assert local.returncode == 0 and "keepalive" not in local.stderr, local.stderr
    mine = bfrun(["--dry-run", "-np", "2", "-H", "a:1,b:1",
                  "--mpi-args=--mca oob_tcp_keepalive_time 60", "python", "train.py"])
    line = mine.stderr.strip().splitlines()[-1]
    assert line.count("oob_tcp_keepalive_time") == 1 and "keepalive_time 60" in line, line
    assert "--mca oob_tcp_keepalive_intvl 5" in line, line


def test_bad_arguments():
    assert bfrun(["-np", "2"]).returncode == 2  # no command
    result = bfrun(["-np", "0", "python", "-c", "pass"])
    assert result.returncode == 2 and "-np must be from 1 to 65536" in result.stderr
    for np_ in ("4294967299", "65537"):  # a count wrapped at 2^32 started processes forever
        for gloo in ([], ["--gloo"]):
            result = bfrun([*gloo, "-np", np_, "python", "-c", "pass"])
            assert result.returncode == 2 and f"got {np_}" in result.stderr, result.stderr
    for gloo in ([], ["--gloo"]):  # over mpirun, a traceback from the start line's count
        result = bfrun([*gloo, "-np", "3", "-H", "localhost:0", "python", "-c", "pass"])
        assert result.returncode == 2, result.stderr
        assert "bfrun: -H: 'localhost:0' has 0 slots" in result.stderr, result.stderr
    result = bfrun(["--gloo", "-H", "localhost:4294967299", "--min-np", "2", "python", "-c",
                    "pass"])
    assert result.returncode == 2 and "a host takes at most 65536" in result.stderr
    result = bfrun(["python", "-c", "pass"])  # no -np
    assert result.returncode == 2 and "-np" in result.stderr
    result = bfrun(["-np", "2", "--hostfile", "/nonexistent/hosts", "python", "-c", "pass"])
    assert result.returncode == 2 and "does not exist" in result.stderr


def test_horovodrun_options_map_or_say_why_they_are_ignored(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("localhost slots=2\n")
    result = bfrun(["--dry-run", "-np", "2", "-hostfile", str(hostfile), "-p", "2222",
                    "--network-interface", "eth0", "--output-filename", str(tmp_path / "out"),
                    "--log-level", "FATAL", "--fusion-threshold-mb", "32", "--cycle-time-ms",
                    "2.5", "--start-timeout", "30", "--autotune", "--tag-output",
                    "python", "train.py"], env={"MY_JOB_SETTING": "x", "AWS_SECRET_KEY": "s"})
    assert result.returncode == 0, result.stderr
    line = result.stderr.strip().splitlines()[-1]
    for part in (f"--hostfile {hostfile}", "--mca plm_rsh_args '-p 2222'",
                 "--mca btl_tcp_if_include eth0", "--mca oob_tcp_if_include eth0",
                 f"--output-filename {tmp_path / 'out'}", "--tag-output",
                 "-x BLUEFOG_FUSION_THRESHOLD", "-x BLUEFOG_CYCLE_TIME", "-x BLUEFOG_LOG_LEVEL",
                 "-x MY_JOB_SETTING"):  # every variable is forwarded, as horovodrun does
        assert part in line, line
    assert "AWS_SECRET_KEY" not in line and "OMPI_" not in line
    assert "--start-timeout: ignored (mpirun starts the ranks itself" in result.stderr
    assert "--autotune: ignored (bluefog has no autotuner" in result.stderr
    version = bfrun(["-v"])
    assert version.returncode == 0 and version.stdout.startswith("bluefog-tf")


@needs_mpirun
def test_horovodrun_settings_reach_the_ranks_tagged():
    code = ("import os, sys; e = os.environ; sys.stdout.write('env %s %s %s\\n' % ("
            "e.get('BLUEFOG_FUSION_THRESHOLD'), e.get('BLUEFOG_CYCLE_TIME'), "
            "e.get('BLUEFOG_LOG_LEVEL')))")
    result = bfrun(["-np", "2", "--fusion-threshold-mb", "2", "--cycle-time-ms", "3",
                    "--log-level", "Warning", "--tag-output", sys.executable, "-c", code])
    assert result.returncode == 0, result.stderr[-3000:]
    for r in range(2):
        assert f"[1,{r}]<stdout>:env 2097152 3.0 warning" in result.stdout, result.stdout


def _x_events(events):
    """{(pid, tensor): [phase names]} of a Chrome trace's complete events."""
    tracks = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
              if e.get("name") == "thread_name"}
    found = {}
    for e in events:
        if e.get("ph") == "X":
            found.setdefault((e["pid"], tracks[(e["pid"], e["tid"])]), []).append(e["name"])
    return found


@needs_mpirun
def test_timeline_filename_is_one_merged_file(tmp_path):
    """--timeline-filename timeline.json, as Horovod takes it: one Chrome trace with every
    rank's events (pid = rank); the per-rank files are gone. --timeline-per-rank keeps them."""
    path = tmp_path / "timeline.json"
    result = bfrun(["-np", "2", "--timeline-filename", str(path), sys.executable, "-c",
                    RANK_SCRIPT], timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    assert sorted(os.listdir(tmp_path)) == ["timeline.json"]
    events = json.loads(path.read_text())
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    assert names == {0: "bluefog rank 0", 1: "bluefog rank 1"}, names
    phases = _x_events(events)
    for rank in range(2):
        allreduce = [v for (pid, t), v in phases.items() if pid == rank and "allreduce" in t]
        assert allreduce and {"QUEUE", "NEGOTIATE", "allreduce"} <= set(allreduce[0]), phases

    apart = tmp_path / "apart"
    apart.mkdir()
    result = bfrun(["-np", "2", "--timeline-filename", str(apart / "t.json"),
                    "--timeline-per-rank", sys.executable, "-c", RANK_SCRIPT], timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    assert sorted(os.listdir(apart)) == ["t.json", "t.rank1.json"]
    for rank, name in enumerate(["t.json", "t.rank1.json"]):
        assert {pid for pid, _ in _x_events(json.loads((apart / name).read_text()))} == {rank}


@needs_mpirun
def test_timeline_stays_valid_json_when_a_rank_is_killed(tmp_path):
    """HOROVOD_TIMELINE (read as BLUEFOG_TIMELINE): rank 1 is killed (SIGKILL) after three
    allreduces, the job fails, and the merged file is still valid JSON with both ranks'
    events up to the kill."""
    code = RANK_SCRIPT + (
        "import os, signal, time\n"
        "for i in range(3):\n"
        "    bf.allreduce(tf.constant([1.0]), name=f'step{i}')\n"
        "if bf.rank() == 1:\n"
        "    time.sleep(0.5)  # the background thread records the last phase after the op\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
        "time.sleep(60)\n")
    path = tmp_path / "timeline.json"
    result = bfrun(["-np", "2", sys.executable, "-c", code], timeout=180,
                   env={"HOROVOD_TIMELINE": str(path)})
    assert result.returncode != 0, result.stdout + result.stderr[-3000:]
    assert sorted(os.listdir(tmp_path)) == ["timeline.json"]
    phases = _x_events(json.loads(path.read_text()))
    for rank in range(2):
        for i in range(3):
            assert "allreduce" in phases.get((rank, f"step{i}"), []), (rank, i, phases)


def test_merge_timelines_reads_a_file_cut_mid_event(tmp_path):
    """A rank's file cut in the middle of an event (a full disk): the merge keeps the events
    before the cut and writes complete JSON."""
    from bluefog.common.timeline import merge_timelines

    meta = '{"name": "process_name", "ph": "M", "pid": %d, "args": {"name": "r%d"}}'
    event = '{"name": "QUEUE", "ph": "X", "pid": %d, "tid": 1, "ts": %d, "dur": 1}'
    (tmp_path / "t.json").write_text(
        "[\n" + ",\n".join([meta % (0, 0), event % (0, 5)]) + "\n]\n")
    (tmp_path / "t.rank1.json").write_text(
        "[\n" + ",\n".join([meta % (1, 1), event % (1, 3), (event % (1, 7))[:20]]))
    assert merge_timelines(str(tmp_path / "t.json"), 3) == [2]
    events = json.loads((tmp_path / "t.json").read_text())
    assert [(e["ph"], e["pid"], e.get("ts")) for e in events] == [
        ("M", 0, None), ("M", 1, None), ("X", 1, 3), ("X", 0, 5)]
    assert sorted(os.listdir(tmp_path)) == ["t.json"]


CHUNKED = """
import os, sys, time
rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
# As Python prints a traceback to an unbuffered stderr: a line in several writes, and the
# ranks' writes interleaved.
parts = ["    ", "import keras", "\\n", "second line\\nthird", " line\\n", "no newline"]
for part in parts if rank == 0 else [p.upper() for p in parts[:-1]]:
    sys.stderr.write(part)
    sys.stderr.flush()
    time.sleep(0.05)
sys.stdout.write("a")
sys.stdout.flush()
time.sleep(0.05)
sys.stdout.write("b\\n")
sys.stdout.flush()
time.sleep(0.5 * rank)  # rank 0 is done when rank 1 fails the job
raise SystemExit(3 if rank == 1 else 0)
"""


@needs_mpirun
def test_rank_tags_are_on_whole_lines():
    """mpirun tags each write; bfrun prints each rank's line whole, tagged once (a line left
    without a newline at the end too), mpirun's own messages and the failing rank's status
    kept."""
    result = bfrun(["-np", "2", sys.executable, "-c", CHUNKED], env={"PYTHONUNBUFFERED": "1"})
    assert result.returncode == 3, result.stderr[-3000:]
    for r, text in ((0, ["    import keras", "second line", "third line", "no newline"]),
                    (1, ["    IMPORT KERAS", "SECOND LINE", "THIRD LINE"])):
        lines = [f"[1,{r}]<stderr>:{t}" for t in text]
        for line in lines:
            assert line in result.stderr.splitlines(), (line, result.stderr)
        assert f"[1,{r}]<stdout>:ab" in result.stdout.splitlines(), result.stdout
    for line in result.stderr.splitlines() + result.stdout.splitlines():
        assert len(re.findall(r"\[1,\d\]<std(?:out|err)>:", line)) <= 1, line
    assert "exited on signal" in result.stderr or "non-zero status" in result.stderr


@pytest.mark.parametrize("backend", ["mpirun", "gloo"])
def test_says_how_many_ranks_it_starts_unless_quiet(backend):
    launcher = ["--gloo"] if backend == "gloo" else []
    if backend == "mpirun" and shutil.which("mpirun") is None:
        pytest.skip("mpirun not installed")
    result = bfrun(launcher + ["-np", "2", "-H", "localhost:2", sys.executable, "-c", "pass"])
    assert result.returncode == 0, result.stderr[-3000:]
    assert "bfrun: starting 2 ranks on 1 host\n" in result.stderr, result.stderr
    quiet = bfrun(launcher + ["-q", "-np", "2", sys.executable, "-c", "pass"])
    assert quiet.returncode == 0, quiet.stderr[-3000:]
    assert "starting" not in quiet.stderr, quiet.stderr


def test_hosts_used_follows_open_mpis_mapping(tmp_path):
    from bluefog.run.bfrun import hosts_used
    assert hosts_used(4, None, None) == 1
    assert hosts_used(4, "a:2,b:2,c:2", None) == 2
    assert hosts_used(5, "a:2,b:2,c:2", None) == 3
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# cluster\na slots=4\nb slots=4\n\nc\n")
    assert hosts_used(4, None, str(hostfile)) == 1
    assert hosts_used(9, None, str(hostfile)) == 3
    assert hosts_used(2, None, str(tmp_path / "none")) is None
