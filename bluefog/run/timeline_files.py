"""The launchers' side of the timeline: which file bfrun merges the ranks' timeline files into
when a job ends, and the merge with its messages (the merge itself is
bluefog.common.timeline.merge_timelines)."""

from __future__ import annotations

import argparse
import sys
from typing import Dict, Optional

from bluefog.common import timeline as _timeline


def timeline_to_merge(args: argparse.Namespace, env: Dict[str, str]) -> Optional[str]:
    """The timeline file bfrun merges the ranks' files into when the job ends: the
    ``BLUEFOG_TIMELINE`` (or ``HOROVOD_TIMELINE``) the ranks get, when it is a ``.json`` file
    name and ``--timeline-per-rank`` is not given; else None."""
    path = env.get("BLUEFOG_TIMELINE") or env.get("HOROVOD_TIMELINE")
    if not path or not path.endswith(".json") or getattr(args, "timeline_per_rank", False):
        return None
    return path


def merge_timeline(path: str, np_: int) -> None:
    """Merges the ranks' timeline files into `path` (bluefog.common.timeline), saying which
    ranks' files were not found (ranks on hosts without a folder shared with this one)."""
    try:
        missing = _timeline.merge_timelines(path, np_)
    except (OSError, ValueError) as e:
        print(f"bfrun: timeline: could not merge the ranks' files into {path}: {e}",
              file=sys.stderr)
        return
    if missing:
        print(f"bfrun: timeline: {path} holds the events of {np_ - len(missing)} of {np_} "
              f"ranks; no file here for rank(s) {missing} (on other hosts they stay there, "
              f"as {_timeline.rank_path(path, missing[0])} ...)", file=sys.stderr)
