"""The Makefile's set-up targets, read with ``make -n`` (nothing is installed): the first
``make demo`` shows pip's progress rather than minutes of silence, and ``make sdist`` needs
only ``build`` and the backend, not the dev environment. The sdist itself is built here."""

import importlib.util
import os
import shutil
import subprocess
import sys
import tarfile

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
needs_make = pytest.mark.skipif(shutil.which("make") is None, reason="make not installed")


def _commands(*args: str) -> list:
    out = subprocess.run(["make", "-n", *args], capture_output=True, text=True, cwd=REPO,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


@needs_make
def test_first_install_shows_pips_progress():
    lines = _commands("-W", "requirements.txt", ".venv/.deps-stamp")
    pip = [line for line in lines if "pip install" in line and "-r requirements.txt" in line]
    assert len(pip) == 1, lines
    assert " -q" not in pip[0], pip[0]
    # A line that says what is coming, before pip's first line.
    before = lines[:lines.index(pip[0])]
    assert any("requirements.txt" in line and "minutes" in line for line in before), lines


@needs_make
def test_sdist_does_not_install_the_dev_environment():
    lines = _commands("-W", "requirements.txt", "SDIST_VENV=/nonexistent/sdist-venv", "sdist")
    assert not [line for line in lines if "requirements.txt" in line], lines
    assert any("pip install" in line and "build" in line for line in lines), lines
    assert any("-m build --sdist" in line for line in lines), lines


@pytest.mark.skipif(importlib.util.find_spec("build") is None
                    or importlib.util.find_spec("scikit_build_core") is None,
                    reason="needs build and scikit-build-core (make sdist installs them)")
def test_the_sdist_builds_and_carries_the_sources_only(tmp_path):
    out = subprocess.run([sys.executable, "-m", "build", "--sdist", "--no-isolation",
                          "--outdir", str(tmp_path), REPO], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    (sdist,) = tmp_path.glob("bluefog_tf-*.tar.gz")
    with tarfile.open(sdist) as tar:
        tops = {name.split("/")[1] for name in tar.getnames() if name.count("/") >= 1}
    assert {"pyproject.toml", "CMakeLists.txt", "csrc", "bluefog"} <= tops, tops
    assert not tops & {".venv", "build", "dist", ".git"}, tops


def test_install_commands_work_outside_a_checkout():
    """bluefog-tf is installed from a checkout or an sdist, not from an index: a command
    `pip install 'bluefog-tf[extra]'` in the docs or a message would fail for the reader."""
    found = []
    paths = [os.path.join(REPO, "README.md")]
    for folder, pattern in (("docs", ".md"), ("bluefog", ".py")):
        for root, _, files in os.walk(os.path.join(REPO, folder)):
            paths += [os.path.join(root, f) for f in files if f.endswith(pattern)]
    for path in paths:
        with open(path, encoding="utf-8") as f:
            if "install 'bluefog-tf[" in f.read():
                found.append(os.path.relpath(path, REPO))
    assert not found, found


@needs_make
def test_make_test_installs_chromium_and_builds_the_site():
    """The README's `make test` runs the site's browser test: chromium from Debian when missing,
    as `make deps` installs Open MPI, and the site built first."""
    text = "\n".join(_commands("-W", "requirements.txt", "test-python")).replace("\\\n", " ")
    assert "if ! command -v chromium" in text, text
    install = text[text.index("if ! command -v chromium"):]
    assert "apt-get install" in install.splitlines()[0] and \
        " chromium " in install.splitlines()[0], install
    assert "mkdocs build --strict" in text, text


@needs_make
def test_bench_targets_write_data_files():
    for target, script in (("bench", "bench/run.py"), ("bench-gloo", "bench/gloo_vs_mpi.py"),
                           ("bench-horovod", "bench/vs_horovod.py")):
        lines = [line for line in _commands("-W", "requirements.txt", target) if script in line]
        assert lines and "--out build/bench/results/" in lines[0], (target, lines)
