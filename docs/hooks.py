"""MkDocs hooks for the bluefog site (mkdocs.yml `hooks:`).

`<!-- bfrun-help -->` in a page becomes the output of `bfrun --help`, run from this checkout's
source at build time, so the command-line reference is never a stale copy.
"""

from __future__ import annotations

import os
import subprocess
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_MARK = "<!-- bfrun-help -->"


def _bfrun_help() -> str:
    env = dict(os.environ, PYTHONPATH=_ROOT, COLUMNS="100")
    out = subprocess.run([sys.executable, "-m", "bluefog.run", "--help"], cwd=_ROOT, env=env,
                         capture_output=True, text=True, timeout=60, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"`bfrun --help` failed ({out.returncode}): {out.stderr}")
    return out.stdout


def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ARG001 (MkDocs' API)
    if _MARK not in markdown:
        return markdown
    return markdown.replace(_MARK, "```text\n" + _bfrun_help().rstrip() + "\n```")
