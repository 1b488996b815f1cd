"""The code samples the guides include (docs/samples/*.py) run at 2 ranks and pass their checks.

The pages include these files (MkDocs snippets), so what a user copies is what ran here. All the
samples run in one `mpirun -np 2` job (tests/python/doc_samples_runner.py), under a timeout.
"""

import glob
import os
import re

import pytest

from mpi_jobs import PYTHON, REPO, have_mpirun, mpirun_prefix, run_job

pytestmark = pytest.mark.skipif(not have_mpirun(), reason="mpirun not installed")

TIMEOUT_S = 120
SAMPLES = sorted(glob.glob(os.path.join(REPO, "docs", "samples", "*.py")))
RUNNER = os.path.join(REPO, "tests", "python", "doc_samples_runner.py")


def test_every_sample_is_included_in_a_page():
    pages = "".join(open(p, encoding="utf-8").read()
                    for p in glob.glob(os.path.join(REPO, "docs", "**", "*.md"), recursive=True))
    pages += open(os.path.join(REPO, "README.md"), encoding="utf-8").read()
    assert SAMPLES, "no samples in docs/samples"
    for path in SAMPLES:
        name = os.path.basename(path)
        assert f'--8<-- "{name}' in pages or f"docs/samples/{name}" in pages, (
            f"docs/samples/{name} is included in no page: include it with --8<-- \"{name}\"")


def test_readme_example_is_the_quickstart_sample():
    # The README cannot include a file, so its Keras example must equal the sample's example.
    sample = open(os.path.join(REPO, "docs", "samples", "keras_quickstart.py"),
                  encoding="utf-8").read()
    example = sample.split("# --8<-- [start:example]\n")[1].split("# --8<-- [end:example]")[0]
    readme = open(os.path.join(REPO, "README.md"), encoding="utf-8").read()
    assert "```python\n" + example + "```" in readme, (
        "README.md's Keras example differs from docs/samples/keras_quickstart.py: copy the "
        "sample's example section into the README")


@pytest.mark.timeout(TIMEOUT_S + 30)
def test_samples_run_at_two_ranks():
    result = run_job(mpirun_prefix(2) + [PYTHON, RUNNER] + SAMPLES, timeout=TIMEOUT_S,
                     env={"TF_CPP_MIN_LOG_LEVEL": "3", "OMP_NUM_THREADS": "1"})
    assert not result.timed_out, f"the samples hung:\n{result.tail()}"
    assert result.returncode == 0, f"a sample failed:\n{result.tail()}"
    for path in SAMPLES:
        stem = os.path.splitext(os.path.basename(path))[0]
        oks = re.findall(rf"{stem} ok rank (\d)", result.output)  # ranks interleave lines
        assert sorted(oks) == ["0", "1"], f"{stem} did not finish on both ranks:\n{result.tail()}"


@pytest.mark.timeout(TIMEOUT_S + 30)
def test_collectives_sample_runs_at_three_ranks():
    """docs/collectives.md's block works at any size, not only at the 2 ranks above."""
    sample = os.path.join(REPO, "docs", "samples", "collectives.py")
    result = run_job(mpirun_prefix(3) + [PYTHON, RUNNER, sample], timeout=TIMEOUT_S,
                     env={"TF_CPP_MIN_LOG_LEVEL": "3", "OMP_NUM_THREADS": "1"})
    assert not result.timed_out, f"the sample hung:\n{result.tail()}"
    assert result.returncode == 0, f"the sample failed:\n{result.tail()}"
    assert sorted(re.findall(r"collectives ok rank (\d)", result.output)) == ["0", "1", "2"], (
        result.tail())
