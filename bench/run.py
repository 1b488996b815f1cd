"""One command for the whole comparison: `make bench` (or `.venv/bin/python bench/run.py`).

Runs, side by side in one go, for 2 and 4 ranks: bluefog's allreduce (eager and tf.function),
raw MPI_Allreduce with buffers allocated once (the MPI floor, in place; timed inside the bluefog
process with its batches interleaved with bluefog's, which the ratios use, and as its own
program; plus, interleaved, out of place, as bluefog must work when the caller keeps its input),
TensorFlow's MultiWorkerMirroredStrategy all-reduce, the 100 x 1 KiB step, gradient compression
(fp16 and bf16 against none, 16 MiB at 2 ranks), the training-step overhead of
DistributedGradientTape at 1 rank, and at 2 ranks the step against its compute alone and its
gradients' allreduce alone (how much of the communication hides behind the compute). Prints
markdown tables with times, bandwidths and ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import results  # noqa: E402  (bench/results.py)

PY = sys.executable
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1", TF_CPP_MIN_LOG_LEVEL="2")
MPIRUN = ["mpirun", "--bind-to", "none"]


def records(cmd: list, timeout: float) -> list:
    out = subprocess.run(cmd, env=ENV, cwd=ROOT, capture_output=True, text=True,
                         timeout=timeout)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stderr[-3000:]}")
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def build_mpi_baseline() -> tuple:
    """The raw MPI program, and the same source as a library for in-process timing."""
    out = os.path.join(ROOT, "build", "bench")
    os.makedirs(out, exist_ok=True)
    src = os.path.join(HERE, "mpi_allreduce.cc")
    exe, lib = os.path.join(out, "mpi_allreduce"), os.path.join(out, "libmpi_allreduce.so")
    subprocess.run(["mpicxx", "-O2", "-std=c++17", src, "-o", exe], check=True)
    subprocess.run(["mpicxx", "-O2", "-std=c++17", "-shared", "-fPIC", "-DBENCH_LIBRARY", src,
                    "-o", lib], check=True)
    return exe, lib


def fmt_time(s: float) -> str:
    return f"{s * 1e6:.1f} us" if s < 1e-3 else f"{s * 1e3:.2f} ms"


def fmt_size(b: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= scale:
            return f"{b // scale} {unit}"
    return f"{b} B"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--max-bytes", type=int, default=64 << 20)
    p.add_argument("--no-mwms", action="store_true", help="skip MultiWorkerMirroredStrategy")
    results.add_out_option(p)
    args = p.parse_args()
    saved = []  # every record of every program, with its rank count and program
    if not shutil.which("mpirun"):
        raise SystemExit("mpirun not found: run `make deps` (installs openmpi-bin)")
    mpi_exe, mpi_lib = build_mpi_baseline()
    floors = []
    for n in args.ranks:
        common = ["--reps", str(args.reps), "--max-bytes", str(args.max_bytes)]
        res = records(MPIRUN + ["-np", str(n), PY, "bench/bf_allreduce.py", "--mpi-lib", mpi_lib]
                      + common, 900)
        res += records(MPIRUN + ["-np", str(n), mpi_exe, "--json"] + common, 600)
        if not args.no_mwms:
            res += records([PY, "bench/tf_mwms.py", "--ranks", str(n), "--json"] + common, 900)
        saved += [dict(r, ranks=n, program="bf_allreduce/mpi_allreduce/tf_mwms") for r in res]
        by = {(r["impl"], r.get("bytes")): r["median_s"] for r in res if "median_s" in r}
        faults = {(r["impl"], r["bytes"]): r["faults_per_call"] for r in res
                  if "faults_per_call" in r}
        busf = 2 * (n - 1) / n
        print(f"\n### Allreduce, float32, {n} ranks (median per call)\n")
        print("| size | bf eager | bf tf.function | raw MPI, interleaved | raw MPI, own program "
              "| MWMS | bf busbw (GB/s) | MPI busbw | best bf / MPI speed | best bf / MWMS speed "
              "| raw MPI out of place | best bf / that |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for (impl, b), _ in sorted(by.items(), key=lambda kv: (kv[0][1] or 0, kv[0][0])):
            if impl != "bf_eager":
                continue
            eager, fn = by[("bf_eager", b)], by[("bf_function", b)]
            mpi, own, mwms = by[("mpi_inproc", b)], by.get(("mpi", b)), by.get(("mwms", b))
            oop = by[("mpi_inproc_oop", b)]
            best = min(eager, fn)
            # Called within this iteration only, so the loop variables are the current ones.
            bw = lambda t: f"{b * busf / t / 1e9:.2f}" if t else "-"  # noqa: E731, B023
            print(f"| {fmt_size(b)} | {fmt_time(eager)} | {fmt_time(fn)} | {fmt_time(mpi)} | "
                  f"{fmt_time(own) if own else '-'} | {fmt_time(mwms) if mwms else '-'} | "
                  f"{bw(best)} | {bw(mpi)} | {mpi / best:.2f}x | "
                  f"{(mwms / best) if mwms else 0:.2f}x | {fmt_time(oop)} | {oop / best:.2f}x |")
            if b >= 1 << 20:
                floors.append((f"{n} ranks {fmt_size(b)}: bf busbw >= 1.0x raw MPI",
                               mpi / best >= 1.0, f"{mpi / best:.2f}x"))
            if b >= 1 << 20 and mwms:
                floors.append((f"{n} ranks {fmt_size(b)}: bf >= 3x MWMS", mwms / best >= 3.0,
                               f"{mwms / best:.2f}x"))
        print("\nIn place (a temporary input, reduced where it lies) and page faults per call "
              f"(rank max), {n} ranks: " + "; ".join(
                  f"{fmt_size(b)}: tf.function with a temporary "
                  f"{fmt_time(by[('bf_function_temp', b)])} of which making it "
                  f"{fmt_time(by[('tf_function_scale', b)])}, per call in a chain of "
                  f"{fmt_time(by[('bf_chain_temp', b)])} of which making it "
                  f"{fmt_time(by[('tf_chain_scale', b)])}, raw MPI in place "
                  f"{fmt_time(by[('mpi_inproc', b)])}; faults eager "
                  f"{faults[('faults_bf_eager', b)]:.0f}, temporary "
                  f"{faults[('faults_bf_function_temp', b)]:.0f}"
                  for b in sorted({k[1] for k in faults}) if b >= 1 << 20))
        transport = os.path.join(ROOT, "build", "cpp", "transport_bench")
        if os.path.exists(transport):  # built by `make bench` (make cpp-build)
            rows = records(MPIRUN + ["-np", str(n), transport], 600)
            saved += [dict(r, ranks=n, program="transport_bench") for r in rows]
            print(f"\nThe transport alone, from C++ without TensorFlow or negotiation, {n} ranks "
                  "(batches interleaved with in-place MPI_Allreduce; MPI / bluefog): "
                  + "; ".join(f"{fmt_size(r['bytes'])} MPI {fmt_time(r['mpi_s'])}, ring "
                              f"{r['mpi_s'] / r['ring_s']:.2f}x, default "
                              f"{r['mpi_s'] / r['default_s']:.2f}x, in place "
                              f"{r['mpi_s'] / r['default_in_place_s']:.2f}x"
                              for r in rows))
            # Every rank copying its input into its output at once moves what any allreduce
            # must move at least, so its time bounds the allreduce's from below.
            print(f"\nOne-host allreduce as a fraction of the memory-traffic bound (every rank "
                  f"copying a buffer of the size at once, same run; 1.0 = the bound), {n} ranks: "
                  + "; ".join(f"{fmt_size(r['bytes'])} default {r['copy_s'] / r['default_s']:.2f}, "
                              f"outputs in the shared heap "
                              f"{r['copy_s'] / r['default_shared_s']:.2f}, in place "
                              f"{r['copy_s'] / r['default_in_place_s']:.2f} (copy "
                              f"{fmt_time(r['copy_s'])})" for r in rows))
            for r in rows:
                if r["bytes"] >= 16 << 20:
                    best = min(r["default_s"], r["default_shared_s"])
                    floors.append((f"{n} ranks {fmt_size(r['bytes'])}: one-host allreduce >= 0.6 "
                                   "of the memory-traffic bound", r["copy_s"] / best >= 0.6,
                                   f"{r['copy_s'] / best:.2f}"))
        fused = by[("bf_function_100x1KiB", None)]
        eager100 = by[("bf_eager_100x1KiB", None)]
        mpi100 = by[("mpi_inproc_100x1KiB", None)]
        grouped = by[("bf_grouped_100x1KiB", None)]
        tf_only = by[("tf_function_100_ops", None)]
        print(f"\n100 x 1 KiB, {n} ranks: one tf.function step {fmt_time(fused)} "
              f"(grouped_allreduce {fmt_time(grouped)}), 100 eager calls {fmt_time(eager100)} "
              f"({eager100 / fused:.1f}x slower), 100 raw MPI_Allreduce "
              f"{fmt_time(mpi100)}; TensorFlow alone runs a tf.function of "
              f"100 trivial ops in {fmt_time(tf_only)}")
        floors.append((f"{n} ranks 100x1KiB: tf.function >= 5x faster than eager",
                       eager100 / fused >= 5, f"{eager100 / fused:.1f}x"))
        floors.append((f"{n} ranks 100x1KiB: tf.function no slower than raw MPI",
                       fused <= mpi100, f"{fused / mpi100:.2f}x MPI's time"))
        ident, lat4 = by[("tf_identity", 4)], by[("bf_eager", 4)]
        mpi4, handoff4 = by[("mpi_inproc", 4)], by[("bf_eager_handoff", 4)]
        before4 = by[("bf_eager_before", 4)]
        over = lat4 - ident - mpi4
        print(f"\n4-byte eager latency, {n} ranks: bf {fmt_time(lat4)} (handed to the "
              f"background thread: {fmt_time(handoff4)}), tf.identity dispatch "
              f"{fmt_time(ident)}, raw MPI {fmt_time(mpi4)}; overhead above both "
              f"{fmt_time(over)} (handed off: {fmt_time(handoff4 - ident - mpi4)}; as before "
              f"2026-12-01, slow path and handed off: {fmt_time(before4)}, overhead "
              f"{fmt_time(before4 - ident - mpi4)})")
        latency = os.path.join(ROOT, "build", "cpp", "runtime_latency_bench")
        if os.path.exists(latency):  # the runtime alone, without TensorFlow
            rows = records(MPIRUN + ["-np", str(n), latency], 600)
            saved += [dict(r, ranks=n, program="runtime_latency_bench") for r in rows]
            print(f"\nThe runtime alone, from C++, {n} ranks (Enqueue and wait; batches "
                  "interleaved): " + "; ".join(
                      f"{fmt_size(r['bytes'])} caller-run {fmt_time(r['bf_drive'])}, handed off "
                      f"{fmt_time(r['bf_handoff'])}, MPI in place {fmt_time(r['mpi_inplace'])}"
                      for r in rows))
        if n == 2:
            floors.append(("2 ranks: 4-byte eager overhead < 100 us", over < 100e-6,
                           fmt_time(over)))
    footprint = os.path.join(ROOT, "build", "cpp", "store_footprint_bench")
    if os.path.exists(footprint):  # one process, no communication (make cpp-build)
        rows = records([footprint], 300)
        saved += [dict(r, ranks=1, program="store_footprint_bench") for r in rows]
        print("\nKeeping the input, one process summing two buffers (no communication; time over "
              "the in-place sum's): " + "; ".join(
                  f"{fmt_size(r['bytes'])} in place {fmt_time(r['in_place_s'])}, out of place "
                  f"{r['plain_s'] / r['in_place_s']:.2f}x, streamed "
                  f"{r['streamed_s'] / r['in_place_s']:.2f}x" for r in rows))
    comp = records(MPIRUN + ["-np", "2", PY, "bench/compression.py", "--mib", "16"], 600)[0]
    saved.append(dict(comp, ranks=2, program="compression"))
    ms = comp["median_ms"]
    print(f"\nGradient compression, 2 ranks on this machine, 8 float32 tensors of 16 MiB in all "
          f"(grouped, tf.function): none {ms['none']:.2f} ms, fp16 {ms['fp16']:.2f} ms "
          f"({comp['vs_none']['fp16']:.2f}x), bf16 {ms['bf16']:.2f} ms "
          f"({comp['vs_none']['bf16']:.2f}x); across a slow link see docs/benchmarks.md")
    tape = records(MPIRUN + ["-np", "1", PY, "bench/tape_overhead.py"], 600)
    saved += [dict(r, ranks=1, program="tape_overhead") for r in tape]
    t = {r["impl"]: r["median_s"] for r in tape}
    ratio = t["distributed_tape"] / t["plain_tape"] - 1
    print(f"\nTraining step at 1 rank: plain tape {fmt_time(t['plain_tape'])}, "
          f"DistributedGradientTape {fmt_time(t['distributed_tape'])} ({ratio * 100:+.1f}%)")
    floors.append(("1 rank: DistributedGradientTape step overhead < 5%", ratio < 0.05,
                   f"{ratio * 100:+.1f}%"))
    overlap = records(MPIRUN + ["-np", "2", PY, "bench/step_overlap.py", "--models", "mlp",
                                "resnet50"], 1800)
    saved += [dict(r, program="step_overlap") for r in overlap]
    print("\n### Training step against its parts, 2 ranks (bench/step_overlap.py)\n")
    print("| model | step | compute only | its gradients' allreduce alone | step / compute "
          "| step / max(compute, comm) | step / (compute + comm) |")
    print("|---|---|---|---|---|---|---|")
    for r in overlap:
        print(f"| {r['model']} | {fmt_time(r['step_s'])} | {fmt_time(r['compute_s'])} | "
              f"{fmt_time(r['comm_s'])} | {r['overhead'] + 1:.3f} | {r['step_over_max']:.3f} | "
              f"{r['step_over_sum']:.3f} |")
        limit = {"mlp": 0.08, "resnet50": 0.03}[r["model"]]
        floors.append((f"2 ranks {r['model']}: step overhead over compute only <= "
                       f"{limit * 100:.0f}%", r["overhead"] <= limit,
                       f"{r['overhead'] * 100:+.1f}%"))
    print("\n### Floors\n")
    for what, ok, value in floors:
        print(f"- {'PASS' if ok else 'FAIL'}: {what} ({value})")
    if args.out:
        saved += [{"program": "floors", "floor": what, "passed": ok, "value": value}
                  for what, ok, value in floors]
        results.write(args.out, "run", saved,
                      "Every record each program printed, with `ranks` and `program` added: "
                      "`impl` names the kind of call, `median_s` its median time per call "
                      "(bench/timing.py); `floors` records are the PASS/FAIL list.")


if __name__ == "__main__":
    main()
