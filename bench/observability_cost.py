"""What seeing inside a job costs a training step: bench/fw_step.py's bluefog step (custom loop,
DistributedGradientTape) with the flight recorder and the hang doctor on (the defaults) against
both off (BLUEFOG_FLIGHT_RECORDER_SIZE=0, BLUEFOG_HANG_DOCTOR=0), launches interleaved (on, off,
off, on, ...). Prints each pair's ratio of step times (on / off) and their median.

    .venv/bin/python bench/observability_cost.py [--pairs 3] [--ranks 2] [--models mlp]
        [--only doctor|recorder]

``--only``: turn off only the hang doctor, or only the flight recorder, in the "off" launches.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none"]
OFF = {"BLUEFOG_FLIGHT_RECORDER_SIZE": "0", "BLUEFOG_HANG_DOCTOR": "0"}


def launch(on: bool, ranks: int, models: list) -> dict:
    env = dict(os.environ)
    for k in OFF:
        env.pop(k, None)
    if not on:
        env.update(OFF)
    cmd = MPIRUN + ["-np", str(ranks)] + sum((["-x", k] for k in OFF if not on), []) + [
        sys.executable, os.path.join(HERE, "fw_step.py"), "--framework", "bluefog",
        "--models"] + models
    out = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stderr[-3000:]}")
    return {r["model"]: r["step_s"] for r in
            (json.loads(line) for line in out.stdout.splitlines() if line.startswith("{"))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--models", nargs="+", default=["mlp"])
    ap.add_argument("--only", choices=["doctor", "recorder"])
    args = ap.parse_args()
    if args.only:
        keep = "BLUEFOG_HANG_DOCTOR" if args.only == "doctor" else "BLUEFOG_FLIGHT_RECORDER_SIZE"
        for k in list(OFF):
            if k != keep:
                del OFF[k]
    print("load before:", os.getloadavg(), flush=True)
    ratios = {m: [] for m in args.models}
    for k in range(args.pairs):
        order = [True, False] if k % 2 == 0 else [False, True]
        got = {on: launch(on, args.ranks, args.models) for on in order}
        for m in args.models:
            ratios[m].append(got[True][m] / got[False][m])
            on_ms, off_ms = got[True][m] * 1e3, got[False][m] * 1e3
            print(f"pair {k}: {m} on {on_ms:.2f} ms, off {off_ms:.2f} ms, "
                  f"on/off {ratios[m][-1]:.3f}", flush=True)
    for m, r in ratios.items():
        print(f"{m}: median on/off {statistics.median(r):.3f} over {len(r)} pairs "
              f"(range {min(r):.3f}-{max(r):.3f})")
    print("load after:", os.getloadavg())


if __name__ == "__main__":
    main()
