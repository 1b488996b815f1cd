"""docs/errors.md's "Launch errors" quote messages that exist in the code: each entry's first
code span (with `…` for the job's values) must be found, piece by piece, in the C++ and Python
sources, so a message changed in the code cannot leave a stale entry behind. Pure, no job."""

from __future__ import annotations

import glob
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The launch errors the page must cover (a phrase of each message).
COVERED = ("rendezvous at", "cannot listen at", "refused this rank's job token",
           "so this process was started to join a job", "is out of range",
           "TF_CONFIG's cluster lists", "Ray found no room", "and never will", "below --min-np",
           "--reset-limit", "already joined this job as rank",
           "the handshake with the Gloo rendezvous server")


def _sources() -> str:
    """Every source file, with adjacent string literals joined ("a "\\n  f"b" -> "a b"), as a
    message split over lines reads."""
    text = []
    for pattern in ("csrc/**/*.cc", "csrc/**/*.h", "bluefog/**/*.py"):
        for path in glob.glob(os.path.join(ROOT, pattern), recursive=True):
            text.append(open(path, encoding="utf-8", errors="replace").read())
    return re.sub(r"\"\s*\n\s*[rfbRFB]*\"", "", "\n".join(text))


def _launch_messages() -> list:
    page = open(os.path.join(ROOT, "docs", "errors.md"), encoding="utf-8").read()
    section = page.split("\n## Launch errors\n", 1)[1].split("\n## ", 1)[0]
    return [" ".join(m.split()) for m in re.findall(r"^- `([^`]+)`", section, re.M)]


def test_launch_errors_are_covered():
    messages = _launch_messages()
    for phrase in COVERED:
        assert any(phrase in m for m in messages), f"docs/errors.md has no entry for {phrase!r}"


def test_launch_errors_quote_the_code():
    code = _sources()
    stale = []
    for message in _launch_messages():
        for piece in re.split(r"…|\d{4,}", message):
            piece = piece.strip(" ;:.,()")
            if len(piece) >= 10 and piece not in code:
                stale.append((piece, message))
    assert not stale, f"docs/errors.md quotes text the code does not print: {stale}"
