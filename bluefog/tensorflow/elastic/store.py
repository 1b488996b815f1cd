"""A host's last commit on its own disk: what lets the next launch of an elastic job carry on.

The driver relaunches every process after a failure, so a commit must outlive the process that
made it. On each ``commit()`` the first rank of each host (local rank 0) writes the state to
``<BLUEFOG_ELASTIC_STATE_DIR>/commit-<hostname>.pkl``: written to a temporary file, then
renamed, so a process killed while writing leaves the previous commit whole. Every host holds
a full copy (all ranks hold the same values after a step), so losing any host loses nothing.
"""

from __future__ import annotations

import os
import pickle
import socket
import warnings
from typing import Any, Dict, List, Optional

import numpy as np

FORMAT = 1


class CommitStore:
    def __init__(self, folder: str):
        self.folder = folder
        self.path = os.path.join(folder, f"commit-{socket.gethostname()}.pkl")

    def write(self, commit_id: int, values: List[np.ndarray], attrs: Dict[str, Any]) -> None:
        os.makedirs(self.folder, exist_ok=True)
        tmp = f"{self.path}.tmp{os.getpid()}"
        record = {"format": FORMAT, "commit": commit_id, "values": values, "attrs": attrs}
        with open(tmp, "wb") as f:
            pickle.dump(record, f, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, self.path)

    def read(self) -> Optional[Dict[str, Any]]:
        """The commit on this host, or None when there is none (or it cannot be read: warned)."""
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
        return record
