"""torchrun-style rendezvous variables (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK)
read by the C++ core (csrc/core/config.cc): a partial set is an error naming what is missing,
never a job of one, and a value past an int is refused, not wrapped. Real processes started
without mpirun, as a scheduler would start them; no TensorFlow (bluefog.common.basics only)."""

from __future__ import annotations

import re
import sys

import pytest

from gloo_jobs import run_gloo_job
from mpi_jobs import PYTHON, JobResult

# A refusal comes before any rendezvous, so each process ends within its start-up.
JOB_TIMEOUT_S = 60

INIT = """
import sys
from bluefog.common import basics
try:
    basics.init()
except basics.BluefogError as e:
    print("REFUSED", e, flush=True)
    sys.exit(3)
print("JOINED", basics.rank(), basics.size(), basics.backend(), flush=True)
"""


def _run(np_: int, rank_env) -> JobResult:
    return run_gloo_job([PYTHON, "-c", INIT], np_, JOB_TIMEOUT_S, rank_env=rank_env)


def test_rank_and_master_without_world_size_is_an_error():
    """RANK with MASTER_ADDR/MASTER_PORT but no WORLD_SIZE: each process fails naming WORLD_SIZE
    (before: each ran as "rank 0 of 1", N unrelated jobs)."""
    result = _run(2, lambda r, port: {"RANK": str(r), "MASTER_ADDR": "127.0.0.1",
                                      "MASTER_PORT": str(port)})
    assert not result.timed_out, result.tail()
    assert "JOINED" not in result.output, result.tail()
    for r in (0, 1):
        assert (f"REFUSED rank {r}: MASTER_ADDR, MASTER_PORT and RANK are set" in result.output
                ), result.tail()
    assert result.output.count("WORLD_SIZE is not set. Set it on every process") == 2


@pytest.mark.parametrize("variables,missing", [
    ({"LOCAL_RANK": "0"}, "MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE are not set"),
    ({"WORLD_SIZE": "2", "RANK": "0"}, "MASTER_ADDR and MASTER_PORT are not set"),
    ({"MASTER_ADDR": "127.0.0.1"}, "MASTER_PORT, RANK and WORLD_SIZE are not set"),
])
def test_any_one_alone_names_the_rest(variables, missing):
    result = _run(1, lambda r, port: dict(variables))
    assert result.returncode == 3 and "REFUSED" in result.output, result.tail()
    assert missing in result.output, result.tail()


@pytest.mark.parametrize("var,value", [("RANK", "4294967297"), ("MASTER_PORT", "4294996796"),
                                       ("WORLD_SIZE", "4294967298")])
def test_values_past_an_int_are_refused(var, value):
    """4294967297 would wrap to 1 (RANK) and 4294996796 to 29500 (MASTER_PORT): refused on the
    process that has it, naming the variable, the value and what it means (rank 0, with good
    values, then ends with its rendezvous timeout)."""
    def rank_env(r, port):
        env = {"RANK": str(r), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(port), "BLUEFOG_GLOO_TIMEOUT": "10"}
        if r == 1 or var == "MASTER_PORT":
            env[var] = value
        return env

    result = _run(2, rank_env)
    assert not result.timed_out, result.tail()
    assert "JOINED 1" not in result.output, result.tail()
    assert re.search(rf"REFUSED environment variable {var}='{value}' is out of range "
                     rf"\(at most 2147483647\); {var} is ", result.output), result.tail()
    assert result.returncode != 0


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))


@pytest.mark.parametrize("var", ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE"])
def test_a_left_over_launcher_size_is_not_a_job_of_one(var):
    """An MPI launcher's size variable with no launcher (left in a shell or an image) beside
    torchrun's variables: each process used to run MPI alone as rank 0 of 1 (the launch
    fuzzer's OMPI_COMM_WORLD_SIZE=2 cases); now each says the launcher's count and MPI's do
    not match."""
    result = _run(2, lambda r, port: {var: "2", "RANK": str(r), "WORLD_SIZE": "2",
                                      "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    assert not result.timed_out, result.tail()
    assert "JOINED" not in result.output, result.tail()
    assert result.output.count(f"REFUSED rank 0: {var}=2 says an MPI launcher started 2 "
                               "processes, but MPI formed a job of 1") == 2, result.tail()
