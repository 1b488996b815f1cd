"""One engine of an ``ibfrun`` cluster: what each rank runs (``-m bluefog.run.ibfrun_engine``).

``ibfrun start`` runs this module under ``bfrun`` (mpirun, or ``bfrun --gloo``), so the process
is a rank of that job and ``bf.init()`` inside it joins the others. The engine asks the
controller for the engine id equal to its rank, so that ``rc[r]`` in the client is rank r. The
controller's connection information comes in ``IPP_CONNECTION_INFO`` (ipyparallel's own
variable, set by ``ibfrun``), so the engines need no shared file system.
"""

from __future__ import annotations

import os
import sys
from typing import Dict, List, Mapping, Optional, Sequence

# Where the launchers put the rank: Open MPI, PMIx (Slurm's srun), PMI, bfrun --gloo.
_RANK_VARIABLES = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "RANK")


def rank_from_env(env: Mapping[str, str]) -> Optional[int]:
    """This process's rank as its launcher set it, or None when no launcher did."""
    for name in _RANK_VARIABLES:
        value = env.get(name, "")
        if value.isdigit():
            return int(value)
    return None


def engine_argv(argv: Sequence[str], env: Mapping[str, str]) -> List[str]:
    """ipengine's arguments: `argv`, plus the engine id this rank requests."""
    args = list(argv)
    rank = rank_from_env(env)
    if rank is not None and not any(a.startswith("--IPEngine.id=") for a in args):
        args.append(f"--IPEngine.id={rank}")
    return args


def main(argv: Optional[Sequence[str]] = None, env: Optional[Dict[str, str]] = None) -> None:
    args = engine_argv(sys.argv[1:] if argv is None else argv, os.environ if env is None else env)
    from ipyparallel.engine.app import IPEngine

    try:
        IPEngine.launch_instance(argv=args)
    except RuntimeError as e:
        # How ipyparallel's engine ends when told to stop (SIGTERM from `ibfrun stop`, or a
        # client's shutdown request): its event loop stops under it. Not an error.
        if "Event loop stopped before Future completed" not in str(e):
            raise


if __name__ == "__main__":
    main()
