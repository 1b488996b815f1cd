"""Two builds of the C++ transport side by side: `bench/transport_vs_mpi.cc` from build folder A
and from build folder B, in interleaved launches (A, B, A, B, ...), each path's time over raw
MPI_Allreduce in the same launch, then B's median ratio over A's per size and path (above 1: B
slower). For checking that a change to the transport costs nothing.

    git worktree add /tmp/before <rev> && make -C /tmp/before cpp-build    # A
    make cpp-build                                                         # B (this checkout)
    python bench/compare_builds.py /tmp/before/build/cpp build/cpp --launches 4 --ranks 2

Each build runs against its own libbluefog_core.so (LD_LIBRARY_PATH). The VM's noise is large
(the same build's ratio moves 2x between launches when other jobs run): compare on an idle
machine, with several launches, and read the spread it prints alongside.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess

ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1")


def launch(build: str, ranks: int) -> dict:
    build = os.path.abspath(build)
    env = dict(ENV, LD_LIBRARY_PATH=build)
    cmd = ["mpirun", "--bind-to", "none", "-np", str(ranks), "-x", "LD_LIBRARY_PATH",
           os.path.join(build, "transport_bench")]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stderr[-2000:]}")
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    return {r["bytes"]: r for r in rows}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--launches", type=int, default=3)
    p.add_argument("--ranks", type=int, default=2)
    args = p.parse_args()
    runs = {"a": [], "b": []}
    for _ in range(args.launches):
        for which in ("a", "b"):
            runs[which].append(launch(getattr(args, which), args.ranks))
    sizes = sorted(runs["a"][0])
    paths = [k[:-2] for k in runs["a"][0][sizes[0]] if k.endswith("_s") and k != "mpi_s"]

    def ratios(which, size, path):
        return [r[size][path + "_s"] / r[size]["mpi_s"] for r in runs[which]]

    print(f"B / A, median over {args.launches} launches of (path time / MPI time), "
          f"{args.ranks} ranks")
    print("| size | " + " | ".join(paths) + " |")
    print("|---" * (len(paths) + 1) + "|")
    for size in sizes:
        cells = [statistics.median(ratios("b", size, p)) / statistics.median(ratios("a", size, p))
                 for p in paths]
        print(f"| {size >> 20} MiB | " + " | ".join(f"{c:.2f}" for c in cells) + " |")
    print("\nspread of the default path's ratio to MPI, launch to launch:")
    for size in sizes:
        a, b = ratios("a", size, "default"), ratios("b", size, "default")
        print(f"  {size >> 20:3} MiB  A {min(a):.2f}-{max(a):.2f}  B {min(b):.2f}-{max(b):.2f}")


if __name__ == "__main__":
    main()
