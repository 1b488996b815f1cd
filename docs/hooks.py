"""MkDocs hooks for the bluefog site (mkdocs.yml `hooks:`).

`<!-- bfrun-help -->` in a page becomes the output of `bfrun --help`, and `<!-- ibfrun-help -->`
that of `ibfrun --help`, `ibfrun start --help` and `ibfrun stop --help`, each run from this
checkout's source at build time, so the command-line reference is never a stale copy.
"""

from __future__ import annotations

import os
import subprocess
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_MARKS = {
    "<!-- bfrun-help -->": [["bluefog.run", "--help"]],
    "<!-- ibfrun-help -->": [["bluefog.run.ibfrun", "--help"],
                             ["bluefog.run.ibfrun", "start", "--help"],
                             ["bluefog.run.ibfrun", "stop", "--help"]],
}


def _help(args: list) -> str:
    env = dict(os.environ, PYTHONPATH=_ROOT, COLUMNS="100")
    out = subprocess.run([sys.executable, "-m"] + args, cwd=_ROOT, env=env,
                         capture_output=True, text=True, timeout=60, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"`{' '.join(args)}` failed ({out.returncode}): {out.stderr}")
    return out.stdout


def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ARG001 (MkDocs' API)
    for mark, commands in _MARKS.items():
        if mark in markdown:
            text = "\n".join(_help(c).rstrip() + "\n" for c in commands)
            markdown = markdown.replace(mark, "```text\n" + text.rstrip() + "\n```")
    return markdown
