"""What BLUEFOG_DETERMINISTIC=1 costs per allreduce size: launches with and without it,
alternated, each timing eager float32 allreduces at 1-64 MiB (median of repeated calls, the
slowest rank's), and the ratio per pair of launches. The worst pair is what to quote: these VMs
change speed between launches.

    python bench/deterministic_cost.py --np 2 --pairs 3
"""

import argparse
import json
import os
import subprocess
import sys

SIZES_MIB = (1, 4, 16, 64)

RANK = f"SIZES_MIB = {SIZES_MIB!r}\n" + """
import json, time
import numpy as np
import tensorflow as tf
tf.config.threading.set_intra_op_parallelism_threads(1)
import bluefog.tensorflow as bf
bf.init()
out = {}
for mib in SIZES_MIB:
    x = tf.constant(np.ones(mib * 262144, np.float32))
    for k in range(30):  # warm: page faults, the path chooser's first choice
        bf.allreduce(x, name=f"warm.{mib}")
    times = []
    for k in range(15):
        t = time.perf_counter()
        bf.allreduce(x, name=f"t.{mib}")
        times.append(time.perf_counter() - t)
    slowest = bf.allreduce(tf.constant([float(np.median(times))]), op=bf.Max, name=f"m.{mib}")
    out[mib] = float(slowest.numpy()[0])
if bf.rank() == 0:
    print("RESULT " + json.dumps(out), flush=True)
"""


def launch(np_, deterministic):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", BLUEFOG_DETERMINISTIC=str(int(deterministic)),
               BLUEFOG_PATH_CACHE="0")
    cmd = [sys.executable, "-m", "bluefog.run", "-np", str(np_), sys.executable, "-c", RANK]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600).stdout
    line = [ln for ln in out.splitlines() if "RESULT " in ln]
    if not line:
        raise SystemExit(f"a launch printed no result:\n{out[-3000:]}")
    return {int(k): v for k, v in json.loads(line[-1].split("RESULT ", 1)[1]).items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--pairs", type=int, default=3)
    args = parser.parse_args()
    worst = {mib: 0.0 for mib in SIZES_MIB}
    for pair in range(args.pairs):
        order = (False, True) if pair % 2 == 0 else (True, False)
        got = {d: launch(args.np, d) for d in order}
        ratios = {mib: got[True][mib] / got[False][mib] for mib in SIZES_MIB}
        for mib in SIZES_MIB:
            worst[mib] = max(worst[mib], ratios[mib])
        ms = {d: {m: round(got[d][m] * 1e3, 2) for m in SIZES_MIB} for d in (False, True)}
        print(json.dumps({"pair": pair, "default_ms": ms[False], "deterministic_ms": ms[True],
                          "ratio": {m: round(r, 3) for m, r in ratios.items()}}), flush=True)
    print(json.dumps({"np": args.np, "worst_ratio": {m: round(r, 3) for m, r in worst.items()}}))


if __name__ == "__main__":
    main()
