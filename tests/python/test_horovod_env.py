"""HOROVOD_* environment variables as aliases of BLUEFOG_* ones, log levels in any case, and
init() arguments checked before anything starts. The mapping is checked on a dict; one
subprocess checks that init() applies it, prints the notice once and that a refused argument
leaves bluefog uninitialized."""

import os
import subprocess
import sys
import textwrap

from bluefog.common import horovod_env

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_horovod_names_map_and_bluefog_names_win():
    env = {"HOROVOD_FUSION_THRESHOLD": "1048576", "HOROVOD_CYCLE_TIME": "3.5",
           "HOROVOD_LOG_LEVEL": "FATAL", "HOROVOD_STALL_CHECK_TIME_SECONDS": "7",
           "BLUEFOG_CYCLE_TIME": "1", "HOROVOD_GPU_OPERATIONS": "NCCL"}
    mapped, ignored = horovod_env.apply(env)
    assert env["BLUEFOG_FUSION_THRESHOLD"] == "1048576"
    assert env["BLUEFOG_CYCLE_TIME"] == "1"  # the BLUEFOG_ name wins
    assert env["BLUEFOG_LOG_LEVEL"] == "error"  # fatal: the quietest level
    assert env["BLUEFOG_STALL_CHECK_TIME"] == "7"
    assert "HOROVOD_CYCLE_TIME -> not used, BLUEFOG_CYCLE_TIME is set" in mapped
    assert any(i.startswith("HOROVOD_GPU_OPERATIONS") for i in ignored)
    text = horovod_env.notice(mapped, ignored)
    assert "HOROVOD_FUSION_THRESHOLD -> BLUEFOG_FUSION_THRESHOLD" in text
    assert horovod_env.notice([], []) == ""


def test_log_levels_in_any_case():
    for given, want in (("INFO", "info"), ("Warning", "warning"), ("fatal", "error"),
                        ("WARN", "warning"), ("loud", "loud")):
        env = {"BLUEFOG_LOG_LEVEL": given}
        horovod_env.apply(env)
        assert env["BLUEFOG_LOG_LEVEL"] == want


def test_init_maps_the_environment_and_a_refused_argument_starts_nothing():
    script = textwrap.dedent("""
        import bluefog.tensorflow as bf
        try:
            bf.init(process_sets="static")
        except TypeError as e:
            print("refused:", e)
        assert not bf.is_initialized()
        bf.init(process_sets="dynamic")
        import os
        from bluefog.common import basics
        # Handed to the core as values: the environment stays as the launcher set it.
        print("hierarchical", basics._tuning("hierarchical"), bf.size(),
              sorted(k for k in os.environ if k.startswith("BLUEFOG_")))
    """)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("HOROVOD_", "BLUEFOG_", "OMPI_COMM_WORLD"))}
    env.update(HOROVOD_FUSION_THRESHOLD="2097152", HOROVOD_LOG_LEVEL="FATAL",
               HOROVOD_HIERARCHICAL_ALLREDUCE="0", BLUEFOG_LOG_LEVEL="WARNING",
               TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=REPO + os.pathsep + env.get("PYTHONPATH", ""))
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            env=env, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "refused: bluefog init: process_sets must be" in result.stdout
    assert "hierarchical 0 1 ['BLUEFOG_LOG_LEVEL']" in result.stdout, result.stdout
    assert result.stderr.count("Horovod environment variables read as bluefog's") == 1
    assert "HOROVOD_LOG_LEVEL -> not used, BLUEFOG_LOG_LEVEL is set" in result.stderr
