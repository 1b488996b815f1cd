"""The Makefile's set-up targets, read with ``make -n`` (nothing is installed): the first
``make demo`` shows pip's progress rather than minutes of silence."""

import os
import shutil
import subprocess

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
