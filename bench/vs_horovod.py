"""bluefog against Horovod 0.28.1, side by side: `make bench-horovod` (or this script).

Horovod is what a TensorFlow user would pick instead. It does not support TensorFlow 2.16+ (Keras
3), so it runs in a venv of its own with tensorflow-cpu 2.15, built here on first use (a few
minutes; cached in ~/.cache/bluefog, or --horovod-venv) with MPI and without Gloo, as its docs
build it for an MPI cluster.

Each launch runs bench/fw_allreduce.py for one framework under mpirun; launches alternate
(bluefog, Horovod, Horovod, bluefog, ...), and every number is taken relative to raw
MPI_Allreduce timed in the same process, interleaved with the framework's calls, so a machine
that drifts between launches (these VMs do, by 2-4x) moves both sides alike. Per size it prints,
over the launches, the median and the worst of:

- eager: the framework's eager allreduce of a kept input over raw out-of-place MPI;
- function: the same inside a tf.function;
- temp: inside a tf.function on a temporary (t * 2, as gradients are), the multiplication's
  own time subtracted, over raw in-place MPI (a temporary may be reduced in place);
- "bluefog faster by": Horovod's ratio over bluefog's (above 1: bluefog faster): the median
  over launch pairs, the pair least favourable to bluefog, and Horovod's worst launch over
  bluefog's worst launch (the pairs mix the VM's states, see faster_by).
- in a graph (a second table): TensorFlow's own cost of calling a tf.function (one that
  communicates nothing), the one-allreduce function's time less that cost over out-of-place
  MPI, and one allreduce of a temporary inside a function of 8 chained ones (their
  multiplications subtracted) over in-place MPI: what each allreduce of a training step's
  graph costs, without the function call that a step pays once;
- "absolute": Horovod's time per call over bluefog's, launch pair by launch pair. Raw MPI in
  Horovod's process is itself slower (its background thread polls every millisecond on the
  same cores), so the normalized ratios above flatter Horovod; the absolute ones do not.

The machine state of each launch is printed too: the load average and raw MPI's time for 1 MiB
in that launch (a slow-state VM shows 2x and more on it).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from functools import partial

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import results  # noqa: E402  (bench/results.py)
from run import ENV, MPIRUN, build_mpi_baseline, fmt_size  # noqa: E402

# What --out writes: allreduce records (with `call`, as docs/data/allreduce_horovod.json) and
# training-step records (with `model`, as docs/data/training_step.json).
RECORDS = []

HOROVOD_VENV = os.path.expanduser("~/.cache/bluefog/horovod-0.28.1-tf2.15")


def horovod_python(venv: str) -> str:
    """The venv's python, building the venv first when it has no working Horovod."""
    py = os.path.join(venv, "bin", "python")
    probe = [py, "-c", "import horovod.tensorflow as hvd; hvd.init(); assert hvd.mpi_built()"]
    if os.path.exists(py) and subprocess.run(probe, env=ENV, capture_output=True).returncode == 0:
        return py
    print(f"building Horovod 0.28.1 with tensorflow-cpu 2.15 in {venv} (once; minutes)",
          flush=True)
    started = time.time()
    subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    pip = [py, "-m", "pip", "install", "-q"]
    subprocess.run(pip + ["--upgrade", "pip"], check=True)
    subprocess.run(pip + ["tensorflow-cpu==2.15.*", "cmake", "setuptools", "wheel",
                          "packaging"], check=True)
    env = dict(os.environ, PATH=os.path.join(venv, "bin") + os.pathsep + os.environ["PATH"],
               HOROVOD_WITH_TENSORFLOW="1", HOROVOD_WITH_MPI="1", HOROVOD_WITHOUT_GLOO="1",
               HOROVOD_WITHOUT_PYTORCH="1", HOROVOD_WITHOUT_MXNET="1")
    subprocess.run(pip + ["--no-build-isolation", "--no-cache-dir", "horovod==0.28.1"],
                   env=env, check=True)
    subprocess.run(probe, env=ENV, check=True)
    print(f"Horovod built in {time.time() - started:.0f} s", flush=True)
    return py


def launch(python: str, framework: str, ranks: int, lib: str, args) -> dict:
    cmd = MPIRUN + ["-np", str(ranks), python, os.path.join(HERE, "fw_allreduce.py"),
                    "--framework", framework, "--mpi-lib", lib, "--reps", str(args.reps),
                    "--max-bytes", str(args.max_bytes)]
    load = os.getloadavg()[0]
    out = subprocess.run(cmd, env=ENV, cwd=ROOT, capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stderr[-3000:]}")
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    by = {(r["impl"], r["bytes"]): r["median_s"] for r in rows}
    return {"framework": framework, "load": load, "times": by}


def step_launch(python: str, framework: str, ranks: int, models: list) -> dict:
    cmd = MPIRUN + ["-np", str(ranks), python, os.path.join(HERE, "fw_step.py"),
                    "--framework", framework, "--models"] + models
    out = subprocess.run(cmd, env=ENV, cwd=ROOT, capture_output=True, text=True, timeout=3600)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stderr[-3000:]}")
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    return {r["model"]: r for r in rows}


def steps(args, hvd_py: str) -> None:
    """Training steps: per model, framework and rank count, the median over launches of the
    step time, the compute-only step time in the same processes, the communication overhead
    (a block's step over the neighbouring compute-only block's, minus 1, median over the
    blocks; fw_step.py) and the scaling efficiency (images/s per rank at N ranks
    over 1 rank). Each launch round also times the compute-only step with no framework at all
    in each venv (fw_step.py --framework none): Horovod's thread slows its compute-only step,
    so its overhead is also given over TensorFlow alone (that launch's step over the
    neighbouring launch of TensorFlow alone, in the same venv)."""
    results = {}  # (kind launched, venv's framework, ranks) -> [per-launch {model: row}]
    for i in range(args.step_launches):
        for fw in (["bluefog", "horovod"] if i % 2 == 0 else ["horovod", "bluefog"]):
            py = sys.executable if fw == "bluefog" else hvd_py
            for kind, ranks in ((fw, 1), (fw, args.ranks), ("none", args.ranks)):
                rows = step_launch(py, kind, ranks, args.models)
                results.setdefault((kind, fw, ranks), []).append(rows)
                print(f"launch {i + 1}, {kind} ({fw}'s venv), {ranks} rank(s): " + "; ".join(
                    f"{m} compute only {r['compute_s']:.4f} s/step" if kind == "none" else
                    f"{m} {r['step_s']:.4f} s/step, compute only {r['compute_s']:.4f}, "
                    f"overhead {r['overhead']:+.1%}" for m, r in rows.items()), flush=True)
    print(f"\nTraining step, median over {args.step_launches} launches (worst launch in "
          f"brackets); overhead = step / compute-only step - 1, same processes, median over "
          f"neighbouring blocks; TF alone = the compute-only step with no framework loaded")
    print(f"| model | framework | s/step at {args.ranks} ranks | compute only | overhead | "
          f"compute only, TF alone | overhead over TF alone | "
          f"scaling efficiency ({args.ranks} vs 1 rank, per rank) |")
    print("|---" * 8 + "|")
    for model in args.models:
        for fw in ("bluefog", "horovod"):
            runs = [r[model] for r in results[(fw, fw, args.ranks)]]
            ones = [r[model] for r in results[(fw, fw, 1)]]
            alone = [r[model]["compute_s"] for r in results[("none", fw, args.ranks)]]
            step = [r["step_s"] for r in runs]
            over = [r["overhead"] for r in runs]
            over_alone = [r["step_s"] / a - 1 for r, a in zip(runs, alone)]
            eff = [r["images_per_s_per_rank"] / o["images_per_s_per_rank"]
                   for r, o in zip(runs, ones)]
            RECORDS.append({
                "model": model, "framework": "bluefog" if fw == "bluefog" else "Horovod",
                "ranks": args.ranks, "step_s": statistics.median(step),
                "step_worst_s": max(step),
                "compute_only_s": statistics.median(r["compute_s"] for r in runs),
                "overhead_pct": statistics.median(over) * 100,
                "overhead_worst_pct": max(over) * 100, "tf_alone_s": statistics.median(alone),
                "over_tf_alone_pct": statistics.median(over_alone) * 100,
                "over_tf_alone_worst_pct": max(over_alone) * 100,
                "scaling_efficiency": statistics.median(eff),
                "scaling_efficiency_worst": min(eff)})
            print(f"| {model} | {fw} | {statistics.median(step):.4f} ({max(step):.4f}) | "
                  f"{statistics.median(r['compute_s'] for r in runs):.4f} | "
                  f"{statistics.median(over):+.1%} ({max(over):+.1%}) | "
                  f"{statistics.median(alone):.4f} | "
                  f"{statistics.median(over_alone):+.1%} ({max(over_alone):+.1%}) | "
                  f"{statistics.median(eff):.2f} ({min(eff):.2f}) |")


CHAIN = 8  # allreduces in fw_allreduce.py's chain_temp


def ratios(run: dict, size: int) -> dict:
    t = run["times"]
    temp = max(t[("function_temp", size)] - t[("scale", size)], 1e-9)
    share = max(t[("function", size)] - t[("call", size)], 1e-9)
    chain = max(t[("chain_temp", size)] - t[("chain_scale", size)], 1e-9) / CHAIN
    return {"eager": t[("eager", size)] / t[("mpi_oop", size)],
            "function": t[("function", size)] / t[("mpi_oop", size)],
            "temp": temp / t[("mpi_inplace", size)],
            "share": share / t[("mpi_oop", size)],
            "chain": chain / t[("mpi_inplace", size)],
            "time_eager": t[("eager", size)], "time_function": t[("function", size)],
            "time_temp": temp, "time_call": t[("call", size)], "time_share": share,
            "time_chain": chain}


def fmt_us(s: float) -> str:
    return f"{s * 1e6:.0f} us" if s < 1e-3 else f"{s * 1e3:.2f} ms"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--launches", type=int, default=4, help="per framework")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--max-bytes", type=int, default=64 << 20)
    p.add_argument("--horovod-venv", default=HOROVOD_VENV)
    p.add_argument("--models", nargs="*", default=["resnet50", "mlp"],
                   help="training-step models (none: skip the steps)")
    p.add_argument("--step-launches", type=int, default=3)
    p.add_argument("--no-allreduce", action="store_true", help="only the training steps")
    p.add_argument("--report", nargs="+", metavar="JSON",
                   help="only print the allreduce tables of saved sweeps (copies of "
                        "build/bench/vs_horovod_allreduce.json), their launches joined")
    results.add_out_option(p)
    args = p.parse_args()
    if args.report:
        report(load_runs(args.report), args.ranks)
    else:
        hvd_py = horovod_python(args.horovod_venv)
        if not args.no_allreduce:
            allreduces(args, hvd_py)
        if args.models:
            steps(args, hvd_py)
    if args.out:
        results.write(args.out, "vs_horovod", RECORDS,
                      f"{args.ranks} ranks; Horovod 0.28.1 with tensorflow-cpu 2.15 in its own "
                      "venv. Records with `call`: horovod_over_bluefog is Horovod's per-call "
                      "time over bluefog's, median over launch pairs; least_favourable_pair, "
                      "slowest_launches as in the printed tables; bluefog_s, horovod_s: median "
                      "time per call (per op for call chain); bluefog_over_mpi_in_place(_worst): "
                      "the chain's op over raw in-place MPI, median (worst) launch. Records "
                      "with `model`: seconds per step, median (worst) over the launches; "
                      "*_pct: overheads in percent.")


def allreduces(args, hvd_py: str) -> None:
    _, lib = build_mpi_baseline()
    runs = {"bluefog": [], "horovod": []}
    save = os.path.join(ROOT, "build", "bench", "vs_horovod_allreduce.json")
    for i in range(args.launches):
        order = ["bluefog", "horovod"] if i % 2 == 0 else ["horovod", "bluefog"]
        for fw in order:
            runs[fw].append(launch(sys.executable if fw == "bluefog" else hvd_py, fw,
                                   args.ranks, lib, args))
            r = runs[fw][-1]
            mib = r["times"].get(("mpi_oop", 1 << 20))
            print(f"launch {i + 1} {fw}: load {r['load']:.2f}, raw MPI 1 MiB out of place "
                  f"{fmt_us(mib) if mib else '-'}", flush=True)
    with open(save, "w") as f:  # every launch's times, for a second look (--report)
        json.dump({fw: [{"load": r["load"], "times": [[k[0], k[1], v] for k, v in
                                                        r["times"].items()]} for r in rs]
                   for fw, rs in runs.items()}, f)
    print(f"(raw times in {os.path.relpath(save, ROOT)})")
    report(runs, args.ranks)


def load_runs(paths: list) -> dict:
    """The launches saved by earlier sweeps (build/bench/vs_horovod_allreduce.json copies),
    joined in order: launch k of each framework stays paired with launch k of the other."""
    runs = {"bluefog": [], "horovod": []}
    for path in paths:
        with open(path) as f:
            saved = json.load(f)
        for fw in runs:
            runs[fw] += [{"load": r["load"], "times": {(k, b): v for k, b, v in r["times"]}}
                         for r in saved[fw]]
    return runs


def pair(rows: list, key: str) -> str:
    """Median / worst (largest) over launches of one ratio."""
    v = [r[key] for r in rows]
    return f"{statistics.median(v):.2f} / {max(v):.2f}"


def faster_by(bf: list, hv: list, key: str) -> str:
    """Horovod's value over bluefog's: launch pair by launch pair, median / worst (smallest);
    then each framework's worst launch (largest value) against the other's. A pair whose two
    launches found the VM in different states (raw MPI in the same process 2-5x apart) reads
    low or high for that reason alone; the worst launch of each side does not pair them."""
    v = [h[key] / b[key] for b, h in zip(bf, hv)]
    worst = max(h[key] for h in hv) / max(b[key] for b in bf)
    return f"{statistics.median(v):.2f}x / {min(v):.2f}x / {worst:.2f}x"


def report(runs: dict, ranks: int) -> None:
    """The allreduce tables over `runs` (per framework, launch by launch)."""
    launches = min(len(runs["bluefog"]), len(runs["horovod"]))
    for fw, rs in runs.items():  # the machine state of each launch
        print(f"{fw}: load / raw MPI 1 MiB out of place per launch: " + ", ".join(
            f"{r['load']:.1f} / {fmt_us(r['times'].get(('mpi_oop', 1 << 20), 0.0))}"
            for r in rs))
    sizes = sorted({b for (_, b) in runs["bluefog"][0]["times"]})
    print(f"\n{ranks} ranks, {launches} launches per framework; time over raw MPI "
          f"in the same process (median / worst launch); lower is better")
    print("| size | bluefog eager | Horovod eager | bluefog function | Horovod function | "
          "bluefog temp (vs in-place) | Horovod temp | bluefog faster by, eager (median / "
          "worst pair / worst launch of each) | function | temp | absolute: eager | function | "
          "temp |")
    print("|---" * 13 + "|")
    for size in sizes:
        bf = [ratios(r, size) for r in runs["bluefog"]]
        hv = [ratios(r, size) for r in runs["horovod"]]
        faster = partial(faster_by, bf, hv)

        for call, key in (("eager", "time_eager"), ("tf.function", "time_function"),
                          ("temporary", "time_temp")):
            v = [h[key] / b[key] for b, h in zip(bf, hv)]
            RECORDS.append({"call": call, "bytes": size, "horovod_over_bluefog":
                            statistics.median(v), "least_favourable_pair": min(v),
                            "slowest_launches": max(h[key] for h in hv) / max(b[key] for b in bf),
                            "bluefog_s": statistics.median(b[key] for b in bf),
                            "horovod_s": statistics.median(h[key] for h in hv)})
        print(f"| {fmt_size(size)} | {pair(bf, 'eager')} | {pair(hv, 'eager')} | "
              f"{pair(bf, 'function')} | {pair(hv, 'function')} | {pair(bf, 'temp')} | "
              f"{pair(hv, 'temp')} | {faster('eager')} | {faster('function')} | "
              f"{faster('temp')} | {faster('time_eager')} | {faster('time_function')} | "
              f"{faster('time_temp')} |")
    print("\nIn a graph: TensorFlow's cost of a tf.function call alone (median over launches), "
          "the one-allreduce function less that cost over out-of-place MPI, and one allreduce "
          f"of a temporary among {CHAIN} chained in a function over in-place MPI (median / "
          "worst launch; lower is better), then bluefog faster by (median / worst launch pair / "
          "worst launch of each, per call)")
    print("| size | call, bluefog's TF / Horovod's | bluefog function less call | Horovod | "
          "bluefog in a chain | Horovod | per op in a chain, bluefog / Horovod | bluefog faster "
          "by, function less call | in a chain |")
    print("|---" * 9 + "|")
    for size in sizes:
        bf = [ratios(r, size) for r in runs["bluefog"]]
        hv = [ratios(r, size) for r in runs["horovod"]]
        faster = partial(faster_by, bf, hv)

        v = [h["time_chain"] / b["time_chain"] for b, h in zip(bf, hv)]
        RECORDS.append({
            "call": "chain", "bytes": size,
            "tf_call_bluefog_s": statistics.median(r["time_call"] for r in bf),
            "tf_call_horovod_s": statistics.median(r["time_call"] for r in hv),
            "bluefog_s": statistics.median(r["time_chain"] for r in bf),
            "bluefog_over_mpi_in_place": statistics.median(r["chain"] for r in bf),
            "bluefog_over_mpi_in_place_worst": max(r["chain"] for r in bf),
            "horovod_s": statistics.median(r["time_chain"] for r in hv),
            "horovod_over_bluefog": statistics.median(v), "least_favourable_pair": min(v),
            "slowest_launches": max(h["time_chain"] for h in hv) /
            max(b["time_chain"] for b in bf)})
        call = [fmt_us(statistics.median(r["time_call"] for r in rows)) for rows in (bf, hv)]
        op = [fmt_us(statistics.median(r["time_chain"] for r in rows)) for rows in (bf, hv)]
        print(f"| {fmt_size(size)} | {call[0]} / {call[1]} | {pair(bf, 'share')} | "
              f"{pair(hv, 'share')} | {pair(bf, 'chain')} | {pair(hv, 'chain')} | "
              f"{op[0]} / {op[1]} | {faster('time_share')} | {faster('time_chain')} |")

    def eager_time(fw, size):
        return fmt_us(statistics.median(ratios(r, size)["time_eager"] for r in runs[fw]))

    print("\nEager time per call (median over launches): " + ", ".join(
        f"{fmt_size(s)}: bluefog {eager_time('bluefog', s)} / Horovod {eager_time('horovod', s)}"
        for s in sizes))


if __name__ == "__main__":
    main()
