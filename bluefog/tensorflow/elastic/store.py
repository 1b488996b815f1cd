"""A host's last commit on its own disk: what lets the next launch of an elastic job carry on.

The driver relaunches every process after a failure, so a commit must outlive the process that
made it. On each ``commit()`` the first rank of each host (local rank 0) writes the state to
``<BLUEFOG_ELASTIC_STATE_DIR>/commit-<hostname>.pkl``: written to a temporary file
(``commit-<hostname>.pkl.tmp<pid>``), flushed to the disk, renamed, and the folder flushed, so
a process killed while writing leaves the previous commit whole and a commit that returned
survives a power loss. A killed writer leaves its temporary file behind: the first write of
the next process on the host removes those whose process is gone. Every host holds a full
copy (all ranks hold the same values after a step), so losing any host loses nothing.
"""

from __future__ import annotations

import os
import pickle
import re
import socket
import warnings
from typing import Any, Dict, List, Optional

import numpy as np

FORMAT = 1


class CommitStore:
    def __init__(self, folder: str):
        self.folder = folder
        self.path = os.path.join(folder, f"commit-{socket.gethostname()}.pkl")
        self._swept = False

    def write(self, commit_id: int, values: List[np.ndarray], attrs: Dict[str, Any],
              names: Optional[List[str]] = None) -> None:
        os.makedirs(self.folder, exist_ok=True)
        if not self._swept:
            self._swept = True
            self.remove_stale_temporaries()
        tmp = f"{self.path}.tmp{os.getpid()}"
        record = {"format": FORMAT, "commit": commit_id, "values": values, "attrs": attrs,
                  "names": names}
        try:
            with open(tmp, "wb") as f:
                pickle.dump(record, f, protocol=pickle.HIGHEST_PROTOCOL)
                f.flush()
                os.fsync(f.fileno())  # the data on the disk before the name points at it
            os.replace(tmp, self.path)
        except BaseException:
            _remove(tmp)
            raise
        folder = os.open(self.folder, os.O_RDONLY)
        try:
            os.fsync(folder)  # the rename itself on the disk
        finally:
            os.close(folder)

    def remove_stale_temporaries(self) -> List[str]:
        """Removes this host's temporary commit files whose writing process is gone (killed
        mid-write); returns their paths. Files of live processes, and of other hosts sharing
        the folder, are left alone: their pids mean nothing here."""
        pattern = re.compile(re.escape(os.path.basename(self.path)) + r"\.tmp(\d+)$")
        removed = []
        for entry in os.listdir(self.folder):
            match = pattern.match(entry)
            if match and not _alive(int(match.group(1))):
                path = os.path.join(self.folder, entry)
                if _remove(path):
                    removed.append(path)
        return removed

    def read(self) -> Optional[Dict[str, Any]]:
        """The commit on this host, or None when there is none (or it cannot be unpickled, or is
        not a bluefog commit: warned). Raises ``ValueError`` saying what is wrong when it is a
        bluefog commit whose content is malformed (a file edited or made by hand)."""
        try:
            with open(self.path, "rb") as f:
                record = pickle.load(f)
        except FileNotFoundError:
            return None
        except Exception as e:  # a truncated or foreign file: start without it, but say so
            warnings.warn(f"bluefog elastic: ignoring the unreadable commit {self.path}: {e}",
                          stacklevel=2)
            return None
        if not isinstance(record, dict) or record.get("format") != FORMAT:
            warnings.warn(f"bluefog elastic: ignoring {self.path}: not a bluefog commit of "
                          f"format {FORMAT}", stacklevel=2)
            return None
        problem = malformed(record)
        if problem:
            raise ValueError(f"{self.path} is malformed: {problem}")
        return record


def _alive(pid: int) -> bool:
    if pid == os.getpid():  # an earlier process with this pid (pids restart in a container)
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _remove(path: str) -> bool:
    try:
        os.remove(path)
        return True
    except FileNotFoundError:
        return False


def malformed(record: Dict[str, Any]) -> str:
    """What is wrong with the fields of a commit record, or "" when nothing is."""
    commit = record.get("commit")
    if isinstance(commit, bool) or not isinstance(commit, (int, np.integer)) or commit < 0:
        return f"'commit' must be an int >= 0, it is {commit!r}"
    values = record.get("values")
    if not isinstance(values, list):
        return f"'values' must be a list of numpy arrays, it is a {type(values).__name__}"
    for j, value in enumerate(values):
        if not isinstance(value, np.ndarray):
            return f"'values'[{j}] must be a numpy array, it is a {type(value).__name__}"
    attrs = record.get("attrs")
    if not isinstance(attrs, dict) or not all(isinstance(k, str) for k in attrs):
        return f"'attrs' must be a dict with str keys, it is {type(attrs).__name__}"
    names = record.get("names")
    if names is not None and (not isinstance(names, list) or len(names) != len(values)):
        return "'names' must be None or a list with one name per value"
    return ""
