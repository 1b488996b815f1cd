"""Runs a small Python program under mpirun for the tests that need their own job
(environment variables read at init, failures that end the job)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap


def run_job(code: str, np: int, env: dict | None = None, timeout: float = 120.0):
    """Runs `code` on `np` ranks; returns the CompletedProcess (stdout and stderr merged)."""
    full_env = dict(os.environ)
    full_env.update({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
                     "OMPI_MCA_rmaps_base_oversubscribe": "1", "TF_CPP_MIN_LOG_LEVEL": "2"})
    full_env.update(env or {})
    prelude = ("import tensorflow as tf\n"
               "tf.config.threading.set_intra_op_parallelism_threads(1)\n"
               "import bluefog.tensorflow as bf\n")
    cmd = ["mpirun", "--bind-to", "none", "-np", str(np), sys.executable, "-c",
           prelude + textwrap.dedent(code)]
    return subprocess.run(cmd, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=timeout)
