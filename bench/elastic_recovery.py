"""Recovery time of in-place elastic training (``bfrun --gloo --min-np``): from a worker's
SIGKILL to the first completed step after it, on this machine (3 local workers of
``examples/elastic_digits.py``, one killed at a fixed step).

    .venv/bin/python bench/elastic_recovery.py [--runs 5] [--commit-every 10]

Prints, per run: the time to the survivors' restored commit (the reset callback's line), to
the first step after it, and how many steps were done again. The relaunching mode's numbers
(over mpirun, which needs hosts of its own: a lost host is blacklisted) come from
``pytest -s tests/python/test_elastic_netns.py -k lost_host``.
"""

import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "bench"))
import results  # noqa: E402  (bench/results.py)


def one_run(commit_every: int, kill_at: int) -> dict:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONUNBUFFERED="1", PYTHONPATH=REPO)
    cmd = [sys.executable, "-m", "bluefog.run", "--gloo", "-np", "3", "--min-np", "2", "-H",
           "localhost:3", sys.executable, "examples/elastic_digits.py", "--epochs", "3",
           "--commit-every", str(commit_every), "--log-steps"]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines = []
    killed_at = None
    pids = {}

    def read():
        for line in proc.stdout:
            lines.append(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    deadline = time.time() + 300
    while killed_at is None and time.time() < deadline and proc.poll() is None:
        text = "".join(lines)
        pids = {w: int(p) for w, p in re.findall(r"^\[(\d+)\] START rank \d+ size \d+ pid (\d+)",
                                                 text, re.M)}
        if re.search(rf"^\[0\] STEP launch 0 epoch 0 batch {kill_at} size 3", text, re.M):
            os.kill(pids["2"], signal.SIGKILL)
            killed_at = time.time()
        time.sleep(0.005)
    proc.wait(timeout=300)
    reader.join(timeout=10)
    out = "".join(lines)
    if proc.returncode != 0 or killed_at is None:
        path = f"/tmp/elastic_recovery_failed_{os.getpid()}.log"
        with open(path, "w") as f:
            f.write(out)
        raise RuntimeError(f"run failed (status {proc.returncode}), output in {path}:\n"
                           f"{out[-3000:]}")
    reset = re.search(r"RESET launch 0: 2 ranks from epoch (\d+) batch (\d+).* t=([\d.]+)", out)
    first = re.search(r"^\[0\] STEP launch 0 epoch \d+ batch \d+ size 2 t=([\d.]+)", out, re.M)
    last3 = re.findall(r"^\[0\] STEP launch 0 epoch 0 batch (\d+) size 3", out, re.M)
    return {"restored": float(reset.group(3)) - killed_at,
            "first_step": float(first.group(1)) - killed_at,
            "redone": int(last3[-1]) + 1 - int(reset.group(2)),
            "identical": "weights identical on all ranks" in out}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--commit-every", type=int, default=10)
    p.add_argument("--kill-at", type=int, default=11, help="rank 0's step (epoch 0) at the kill")
    results.add_out_option(p)
    args = p.parse_args()
    print("run  restored commit (s)  first step after (s)  steps redone  weights identical")
    runs = []
    for i in range(args.runs):
        r = one_run(args.commit_every, args.kill_at)
        runs.append(r)
        print(f"{i:3d}  {r['restored']:19.2f}  {r['first_step']:20.2f}  {r['redone']:12d}  "
              f"{r['identical']}", flush=True)
    firsts = sorted(r["first_step"] for r in runs)
    print(f"first step after the failure: {firsts[0]:.2f}-{firsts[-1]:.2f} s, median "
          f"{firsts[len(firsts) // 2]:.2f} s")
    if args.out:
        redone = [r["redone"] for r in runs]
        restored = [r["restored"] for r in runs]
        results.write(args.out, "elastic_recovery", [
            {"mode": "in place", "event": "commit restored", "min_s": min(restored),
             "median_s": statistics.median(restored), "max_s": max(restored),
             "runs": len(restored), "source": "bench/elastic_recovery.py"},
            {"mode": "in place", "event": "first step after the failure", "min_s": firsts[0],
             "median_s": statistics.median(firsts), "max_s": firsts[-1], "runs": len(firsts),
             "steps_redone_min": min(redone), "steps_redone_max": max(redone),
             "source": "bench/elastic_recovery.py"}],
            "Seconds from a worker's SIGKILL to each event, 3 local workers of "
            "examples/elastic_digits.py under bfrun --gloo --min-np 2, committing every "
            f"{args.commit_every} steps; min_s/max_s: the range over the runs.")


if __name__ == "__main__":
    main()
