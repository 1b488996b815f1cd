"""Fault-tolerant windows (bf.init(fault_tolerant=True)) on Gloo: how long the survivors of a
SIGKILL take for their next push-sum step, and what the mode costs when nothing fails.

    .venv/bin/python bench/ft_gossip.py [-np 4] [--runs 3] [--steps 200] [--out FILE.json]

Each job is -np local ranks of tests/python/ft_windows_job.py (win_accumulate with push-sum
weights and require_mutex to every out-neighbour, then win_update_then_collect, per step).

* Kill: rank np-1 SIGKILLs itself at a fixed step. Per survivor: its median step time before
  the kill, and the time from the kill to the end of its first step that started after it
  (the issue's floor: within one step time + 100 ms).
* Overhead: jobs with and without the mode, interleaved (plain, tolerant, tolerant, plain,
  ...): the ratio of their median step times (the ranks' medians, averaged), pair by pair.

Prints `uptime` before and after: the host is shared, and the numbers move with its load.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "bench"))
sys.path.insert(0, os.path.join(REPO, "tests", "python"))
import results  # noqa: E402  (bench/results.py)

from gloo_jobs import run_gloo_job  # noqa: E402

JOB = os.path.join(REPO, "tests", "python", "ft_windows_job.py")


def job(np_: int, steps: int, extra: list) -> tuple:
    out = tempfile.mkdtemp(prefix="ft_gossip_")
    result = run_gloo_job([sys.executable, JOB, out, str(steps), *extra], np_, 300,
                          env={"TF_CPP_MIN_LOG_LEVEL": "3"})
    if result.timed_out:
        raise RuntimeError(f"the job timed out:\n{result.tail()}")
    found = {}
    for name in os.listdir(out):
        if name.startswith("rank") or name == "dead.json":
            with open(os.path.join(out, name)) as f:
                found[name] = json.load(f)
    return found, result


def median_step(times) -> float:
    return statistics.median(b - a for a, b in times)


def kill_run(np_: int, steps: int) -> list:
    at = steps // 2
    found, result = job(np_, steps, ["--kill", f"{np_ - 1}@{at}"])
    dead = found.get("dead.json")
    if dead is None:
        raise RuntimeError(f"the dying rank wrote nothing:\n{result.tail()}")
    rows = []
    for name, r in sorted(found.items()):
        if name == "dead.json":
            continue
        before = [t for t in r["times"] if t[1] < dead["time"]]
        after = [t for t in r["times"] if t[0] >= dead["time"]]
        normal = median_step(before[len(before) // 4:])
        first = after[0][1] - dead["time"] if after else float("nan")
        rows.append({"rank": r["rank"], "normal_step_s": normal, "first_step_after_kill_s": first,
                     "floor_s": normal + 0.1, "within_floor": first <= normal + 0.1})
    return rows


def overhead(np_: int, steps: int, runs: int) -> dict:
    medians = {"plain": [], "tolerant": []}
    for i in range(runs):
        # Each pair in the other order too, so neither mode always runs first.
        for mode in ("plain", "tolerant") if i % 2 == 0 else ("tolerant", "plain"):
            found, _ = job(np_, steps, ["--plain"] if mode == "plain" else [])
            medians[mode].append(statistics.mean(median_step(r["times"][steps // 4:])
                                                 for r in found.values()))
    ratios = [t / p for p, t in zip(medians["plain"], medians["tolerant"])]
    return {"plain_step_s": statistics.median(medians["plain"]),
            "tolerant_step_s": statistics.median(medians["tolerant"]),
            "ratio_median": statistics.median(ratios), "ratio_min": min(ratios),
            "ratio_max": max(ratios), "runs": runs}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-np", type=int, default=4)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--steps", type=int, default=200)
    results.add_out_option(p)
    args = p.parse_args()
    load_before = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    print("uptime:", load_before)
    kills = []
    for i in range(args.runs):
        rows = kill_run(args.np, args.steps)
        kills.extend(rows)
        for r in rows:
            print(f"kill run {i} rank {r['rank']}: normal step {r['normal_step_s'] * 1e3:.1f} ms, "
                  f"first step after the kill done {r['first_step_after_kill_s'] * 1e3:.1f} ms "
                  f"after it (floor {r['floor_s'] * 1e3:.1f} ms: "
                  f"{'met' if r['within_floor'] else 'MISSED'})", flush=True)
    over = overhead(args.np, args.steps, args.runs)
    print(f"no failure: plain {over['plain_step_s'] * 1e3:.2f} ms/step, fault-tolerant "
          f"{over['tolerant_step_s'] * 1e3:.2f} ms/step; ratio median {over['ratio_median']:.3f} "
          f"(range {over['ratio_min']:.3f}-{over['ratio_max']:.3f}) over {over['runs']} "
          "interleaved pairs")
    load_after = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    print("uptime:", load_after)
    if args.out:
        results.write(args.out, "ft_gossip",
                      [dict(r, ranks=args.np, event="sigkill") for r in kills]
                      + [dict(over, ranks=args.np, event="no failure")],
                      f"{args.np} local Gloo ranks of tests/python/ft_windows_job.py; uptime "
                      f"before: {load_before}; after: {load_after}")


if __name__ == "__main__":
    main()
