"""Seeded runs of examples/keras_digits.py with BLUEFOG_DETERMINISTIC=1: do they end with
bitwise-equal weights whatever the allreduce path and the fusion? For each rank count, every
combination of a path setting and fusion on or off runs --runs times; the example prints a
fingerprint of its final weights, and all of a rank count's fingerprints must be one.

    python bench/deterministic_runs.py [--np 2 3 4] [--runs 10] [--epochs 3] [--control]

Path settings (one host, mpirun): the default (the one-host paths, timed choice), the direct
path only (BLUEFOG_STAGED_ALLREDUCE=0), the staged/shared paths only
(BLUEFOG_DIRECT_ALLREDUCE=0), and no one-host paths (BLUEFOG_LOCAL_ROUNDS=0
BLUEFOG_DIRECT_ALLREDUCE=0: the deterministic algorithm's messages). Fusion off is
BLUEFOG_FUSION_THRESHOLD=0. TensorFlow's own kernels run with TF_DETERMINISTIC_OPS=1.
--control runs the same without BLUEFOG_DETERMINISTIC, to show whether the setting is what
makes them agree (at 2 ranks a sum has one order anyway).
"""

import argparse
import os
import re
import subprocess
import sys
from collections import defaultdict

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PATHS = {
    "default": {},
    "direct": {"BLUEFOG_STAGED_ALLREDUCE": "0"},
    "staged": {"BLUEFOG_DIRECT_ALLREDUCE": "0"},
    "messages": {"BLUEFOG_LOCAL_ROUNDS": "0", "BLUEFOG_DIRECT_ALLREDUCE": "0"},
}
FINGERPRINT = re.compile(r"weights identical on all ranks \(fingerprint ([0-9a-f]+)\)")


def run(np_: int, extra: dict, epochs: int, deterministic: bool) -> str:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", TF_DETERMINISTIC_OPS="1",
               BLUEFOG_PATH_CACHE="0", **extra)
    if deterministic:
        env["BLUEFOG_DETERMINISTIC"] = "1"
    cmd = [sys.executable, "-m", "bluefog.run", "-np", str(np_), sys.executable,
           os.path.join(REPO, "examples", "keras_digits.py"), "--epochs", str(epochs)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    found = FINGERPRINT.search(out.stdout + out.stderr)
    if out.returncode != 0 or not found:
        raise SystemExit(f"{' '.join(cmd)} with {extra} failed ({out.returncode}):\n"
                         f"{(out.stdout + out.stderr)[-3000:]}")
    return found.group(1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--np", type=int, nargs="+", default=[2, 3, 4])
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--control", action="store_true", help="without BLUEFOG_DETERMINISTIC")
    args = p.parse_args()
    ok = True
    for np_ in args.np:
        prints = defaultdict(list)
        for _ in range(args.runs):  # runs outermost: the settings interleaved
            for path, env in PATHS.items():
                for fusion in ("on", "off"):
                    extra = dict(env, **({} if fusion == "on" else
                                         {"BLUEFOG_FUSION_THRESHOLD": "0"}))
                    prints[(path, fusion)].append(run(np_, extra, args.epochs,
                                                      not args.control))
        distinct = {f for runs in prints.values() for f in runs}
        ok = ok and len(distinct) == 1
        print(f"np {np_}: {sum(len(v) for v in prints.values())} runs, "
              f"{len(distinct)} distinct fingerprint(s)")
        for (path, fusion), runs in prints.items():
            print(f"  {path:9} fusion {fusion:3}: {' '.join(sorted(set(runs)))}")
    sys.exit(0 if ok or args.control else 1)


if __name__ == "__main__":
    main()
