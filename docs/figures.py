"""The site's figures and measurement tables, made from the results files in docs/data/ (the
format: bench/results.py). `make docs` calls it through docs/hooks.py: `![...](figures/NAME.png)`
in a page is drawn at build time, `<!-- bench-table: NAME -->` becomes that table, so a table
and its figure show the same numbers.

    .venv/bin/python docs/figures.py [--data docs/data] [--out build/figures]

writes every figure as PNG into --out, to look at results before they are published.
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import json
import os
import statistics

import matplotlib

matplotlib.use("Agg")  # no display: the figures are files
import matplotlib.pyplot as plt  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DATA = os.path.join(HERE, "data")


def _load_results_module():
    """bench/results.py, loaded from its file: bench/ on sys.path would shadow other modules
    (bench/run.py, bench/timing.py) in whatever process draws the figures."""
    spec = importlib.util.spec_from_file_location(
        "bluefog_bench_results", os.path.join(ROOT, "bench", "results.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


results = _load_results_module()

KiB, MiB = 1 << 10, 1 << 20
BLUEFOG, HOROVOD, MPI, GLOO = "#1565c0", "#c62828", "#424242", "#2e7d32"


def load(data: str, name: str, has: str = "") -> list:
    """The records of docs/data/NAME.json (those with the key `has`, when given: a file of
    bench/vs_horovod.py --out holds allreduce records, with `call`, and step records, with
    `model`)."""
    recs = results.read(os.path.join(data, name + ".json"))["records"]
    return [r for r in recs if not has or has in r]


def size_text(b: float) -> str:
    for unit, scale in (("MiB", MiB), ("KiB", KiB)):
        if b >= scale:
            return f"{b / scale:g} {unit}"
    return f"{b:g} B"


def _size_axis(ax, sizes) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes)
    ax.set_xticklabels([size_text(s) for s in sizes], rotation=45, ha="right")
    ax.minorticks_off()
    ax.set_xlabel("message size (float32)")
    ax.grid(True, which="major", alpha=0.3)


def _one_host_series(data: str) -> dict:
    """Time per call on one host, 2 ranks, as label -> (sizes, seconds, style)."""
    recs = load(data, "allreduce_horovod", has="call")
    eager = [r for r in recs if r.get("call") == "eager"]
    chain = [r for r in recs if r.get("call") == "chain"]
    return {
        "bluefog, eager": ([r["bytes"] for r in eager], [r["bluefog_s"] for r in eager],
                           dict(color=BLUEFOG, marker="o")),
        "Horovod 0.28.1, eager (bluefog's time x median ratio)": (
            [r["bytes"] for r in eager],
            [r["bluefog_s"] * r["horovod_over_bluefog"] for r in eager],
            dict(color=HOROVOD, marker="o")),
        "bluefog, per op in a tf.function": ([r["bytes"] for r in chain],
                                             [r["bluefog_s"] for r in chain],
                                             dict(color=BLUEFOG, marker="s", ls="--")),
        "Horovod, per op in a tf.function": ([r["bytes"] for r in chain],
                                             [r["horovod_s"] for r in chain],
                                             dict(color=HOROVOD, marker="s", ls="--")),
        "raw in-place MPI_Allreduce (same processes)": (
            [r["bytes"] for r in chain],
            [r["bluefog_s"] / r["bluefog_over_mpi_in_place"] for r in chain],
            dict(color=MPI, marker="^", ls=":")),
    }


def _hosts_series(data: str) -> dict:
    recs = load(data, "gloo_vs_mpi_hosts")
    out = {}
    for link, ls in (("not shaped", "-"), ("1 Gbit/s", "--")):
        mine = [r for r in recs if r["link"] == link]
        for backend, key, color in (("Gloo", "gloo_s", GLOO), ("MPI", "mpi_s", MPI)):
            out[f"{backend}, link {link}"] = ([r["bytes"] for r in mine], [r[key] for r in mine],
                                              dict(color=color, marker="o", ls=ls))
    return out


def _plot_series(ax, series: dict, transform=lambda b, t: t) -> None:
    for label, (sizes, times, style) in series.items():
        ax.plot(sizes, [transform(b, t) for b, t in zip(sizes, times)], label=label, **style)


def allreduce_latency(data: str):
    fig, axes = plt.subplots(1, 2, figsize=(12, 5))
    one = _one_host_series(data)
    _plot_series(axes[0], one)
    axes[0].set_title("One host, 2 ranks: time per allreduce")
    hosts = _hosts_series(data)
    _plot_series(axes[1], hosts)
    floor = [r for r in load(data, "gloo_vs_mpi_hosts") if r["link_floor_s"]]
    axes[1].plot([r["bytes"] for r in floor], [r["link_floor_s"] for r in floor], color="#9e9e9e",
                 ls=":", label="1 Gbit/s link floor")
    axes[1].set_title("2 hosts, 1 rank each: time per allreduce")
    for ax, series in ((axes[0], one), (axes[1], hosts)):
        _size_axis(ax, sorted({b for v in series.values() for b in v[0]}))
        ax.set_yscale("log")
        ax.set_ylabel("seconds (median)")
        ax.legend(fontsize=8)
    return fig


def gloo_one_host(data: str):
    ratio = load(data, "gloo_vs_mpi_one_host")
    fig, ax = plt.subplots(figsize=(8, 4))
    for n, color in ((2, GLOO), (3, "#81c784")):
        mine = [r for r in ratio if r["ranks"] == n]
        b = [r["bytes"] for r in mine]
        ax.plot(b, [r["gloo_over_mpi"] for r in mine], color=color, marker="o",
                label=f"{n} ranks{' (on 2 cores)' if n == 3 else ''}, median")
        ax.plot(b, [r["worst_launch_ratio"] for r in mine], color=color, marker="x", ls="",
                label=f"{n} ranks, slowest launch of each")
    ax.axhline(1.0, color=MPI, lw=1)
    _size_axis(ax, sorted({r["bytes"] for r in ratio}))
    ax.set_ylabel("Gloo's time / MPI's (below 1: Gloo faster)")
    ax.set_title("One host: bf.allreduce under bfrun --gloo against mpirun")
    ax.legend(fontsize=8)
    return fig


def allreduce_busbw(data: str):
    """Bus bandwidth: bytes x 2(n-1)/n over the time, as nccl-tests define it (n = 2 here)."""
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    busbw = lambda b, t: b * 2 * (2 - 1) / 2 / t / 1e9  # noqa: E731
    one = _one_host_series(data)
    _plot_series(axes[0], one, busbw)
    axes[0].set_title("One host, 2 ranks")
    hosts = _hosts_series(data)
    _plot_series(axes[1], hosts, busbw)
    axes[1].axhline(1e9 / 8 / 1e9, color="#9e9e9e", ls=":", label="1 Gbit/s link")
    axes[1].set_title("2 hosts, 1 rank each")
    for ax, series in ((axes[0], one), (axes[1], hosts)):
        _size_axis(ax, sorted({b for v in series.values() for b in v[0]}))
        ax.set_yscale("log")
        ax.set_ylabel("bus bandwidth, GB/s")
        ax.legend(fontsize=8)
    return fig


def training_step(data: str):
    recs = load(data, "training_step", has="model")
    models = list(dict.fromkeys(r["model"] for r in recs))
    fig, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 4.2))
    for ax, model in zip(axes, models):
        mine = [r for r in recs if r["model"] == model]
        width = 0.27
        for i, (key, label, alpha) in enumerate((("tf_alone_s", "TensorFlow alone", 0.35),
                                                 ("compute_only_s", "compute only", 0.6),
                                                 ("step_s", "training step", 1.0))):
            xs = [j + (i - 1) * width for j in range(len(mine))]
            ys = [r[key] for r in mine]
            bars = ax.bar(xs, ys, width, alpha=alpha, label=label,
                          color=[BLUEFOG if r["framework"] == "bluefog" else HOROVOD
                                 for r in mine], edgecolor="black", linewidth=0.5)
            if key == "step_s":
                ax.errorbar(xs, ys, yerr=[[0] * len(mine),
                                          [r["step_worst_s"] - r["step_s"] for r in mine]],
                            fmt="none", ecolor="black", capsize=3)
                for bar, r in zip(bars, mine):
                    ax.annotate(f"+{r['over_tf_alone_pct']:g}% over\nTF alone",
                                (bar.get_x() + bar.get_width() / 2, r["step_worst_s"]),
                                ha="center", va="bottom", fontsize=7)
        ax.set_xticks(range(len(mine)))
        ax.set_xticklabels([f"{r['framework']}\n(efficiency {r['scaling_efficiency']:.2f})"
                            for r in mine])
        ax.set_ylabel("seconds per step at 2 ranks (median; bar: worst launch)")
        ax.set_ylim(0, max(r["step_worst_s"] for r in mine) * 1.3)
        ax.set_title(model)
        ax.legend(fontsize=7, loc="upper left")
    return fig


def tta_hosts(data: str):
    recs = load(data, "tta_hosts")
    methods = list(dict.fromkeys(r["method"] for r in recs))
    fig, ax = plt.subplots(figsize=(10, 3.2))
    colors = {"allreduce": MPI, "hierarchical": BLUEFOG, "winput": "#ef6c00"}
    for i, m in enumerate(methods):
        mine = [r for r in recs if r["method"] == m]
        times = [r["time_to_target_s"] for r in mine]
        ax.barh(i, statistics.median(times), color=colors.get(m, BLUEFOG), alpha=0.8)
        ax.plot(times, [i] * len(times), "k|", markersize=14, label="one round" if i == 0 else None)
        ax.annotate(f" median {statistics.median(times):.3g} s", (max(times), i), va="center",
                    fontsize=8)
    ax.set_yticks(range(len(methods)))
    ax.set_yticklabels([next(r["label"] for r in recs if r["method"] == m) for m in methods],
                       fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel(f"seconds of training until rank 0 reaches {recs[0]['target']:.4f} test "
                  "accuracy (log scale)")
    ax.set_title("Time to accuracy, 2 hosts x 4 ranks over 250 Mbit/s")
    ax.legend(fontsize=7, loc="upper right")
    ax.grid(True, axis="x", alpha=0.3)
    return fig


def elastic_recovery(data: str):
    recs = load(data, "elastic_recovery")
    modes = list(dict.fromkeys(r["mode"] for r in recs))
    fig, ax = plt.subplots(figsize=(10, 4.2))
    for i, mode in enumerate(modes):
        mine = [r for r in recs if r["mode"] == mode]
        for k, r in enumerate(mine):
            # Events of one mode on rows of their own: their ranges overlap.
            y = i + (k - (len(mine) - 1) / 2) * 0.22
            last = r["event"] == "first step after the failure"
            color = BLUEFOG if last else "#ef6c00"
            lo, hi = r["min_s"], r["max_s"]
            ax.plot([lo, hi], [y, y], color=color, lw=7, solid_capstyle="butt", alpha=0.8)
            ax.plot([lo, hi], [y, y], "|", color="black", markersize=10)
            if "median_s" in r:
                ax.plot([r["median_s"]], [y], "wo", markersize=4)
            span = f"{lo:g}" if lo == hi else f"{lo:g}-{hi:g}"
            ax.annotate(f" {r['event']}: {span} s", (hi * 1.08, y), ha="left", va="center",
                        fontsize=7)
    ax.set_yticks(range(len(modes)))
    ax.set_yticklabels(modes)
    ax.set_ylim(len(modes) - 0.4, -0.6)
    ax.set_xscale("log")
    ax.set_xlim(0.1, 500)
    ax.set_xlabel("seconds after a worker's SIGKILL (log scale; bar: range over the runs, "
                  "dot: median)")
    ax.set_title("Elastic training: from a lost worker to the next step")
    ax.grid(True, axis="x", alpha=0.3)
    return fig


PHASE_COLORS = {"QUEUE": "#bdbdbd", "NEGOTIATE": "#ef6c00"}


def timeline(data: str):
    """The trace in docs/data/timeline.json (a real 2-rank run), drawn as Perfetto shows it."""
    with open(os.path.join(data, "timeline.json")) as f:
        events = json.load(f)
    names = {(e["pid"], e.get("tid")): e["args"]["name"] for e in events if e["ph"] == "M"}
    spans = [e for e in events if e["ph"] == "X"]
    t0 = min(e["ts"] for e in spans)
    ranks = sorted({e["pid"] for e in spans})
    fig, axes = plt.subplots(len(ranks), 1, figsize=(12, 1.2 + 1.6 * len(ranks)), sharex=True,
                             squeeze=False)
    axes = axes[:, 0]
    seen = set()
    for ax, rank in zip(axes, ranks):
        tracks = sorted({e["tid"] for e in spans if e["pid"] == rank})
        for row, tid in enumerate(tracks):
            for e in (e for e in spans if e["pid"] == rank and e["tid"] == tid):
                # The runtime's phases are QUEUE, NEGOTIATE and the op's name (lower case:
                # allreduce, broadcast...); anything else is an activity of the script's own.
                if e["name"] in PHASE_COLORS:
                    phase, color = e["name"], PHASE_COLORS[e["name"]]
                elif e["name"].islower():
                    phase, color = "communication", BLUEFOG
                else:
                    phase, color = "activity (bf.timeline_context)", GLOO
                start, dur = (e["ts"] - t0) / 1e3, max(e["dur"] / 1e3, 0.02)
                ax.broken_barh([(start, dur)], (row - 0.4, 0.8), color=color,
                               edgecolor="white", linewidth=0.5,
                               label=None if phase in seen else phase)
                if phase.startswith("activity"):
                    ax.text(start + dur / 2, row, e["name"], ha="center", va="center",
                            fontsize=7, color="white")
                seen.add(phase)
        ax.set_yticks(range(len(tracks)))
        ax.set_yticklabels([names.get((rank, t), str(t)) for t in tracks], fontsize=7)
        ax.invert_yaxis()
        ax.set_ylabel(names.get((rank, None), f"rank {rank}"), fontsize=8)
        ax.grid(True, axis="x", alpha=0.3)
    axes[-1].set_xlabel("milliseconds")
    fig.legend(loc="upper right", fontsize=8, ncol=4)
    fig.suptitle("Timeline of 2 ranks (BLUEFOG_TIMELINE), one track per tensor", x=0.3)
    return fig


FIGURES = {"allreduce_latency": allreduce_latency, "allreduce_busbw": allreduce_busbw,
           "gloo_one_host": gloo_one_host,
           "training_step": training_step, "tta_hosts": tta_hosts,
           "elastic_recovery": elastic_recovery, "timeline": timeline}


def render(name: str, data: str = DATA) -> bytes:
    """One figure as PNG bytes."""
    fig = FIGURES[name](data)
    fig.tight_layout()
    buf = io.BytesIO()
    # No timestamp in the file, so that a rebuild of the same data gives the same bytes.
    fig.savefig(buf, format="png", dpi=100, metadata={"Software": None})
    plt.close(fig)
    return buf.getvalue()


# Tables -------------------------------------------------------------------------------------


def _sig(v: float) -> str:
    """Three significant digits, trailing zeros kept (8.20, 90.0, 110)."""
    return f"{v:#.3g}".rstrip(".")


def _time(s: float) -> str:
    return f"{s * 1e6:.0f} us" if s < 1e-3 else f"{_sig(s * 1e3)} ms"


def _ms(s: float) -> str:
    v = s * 1e3
    return f"{v:.1f}" if v < 100 else f"{v:.0f}"


def _faster(r: dict) -> str:
    return " / ".join(_sig(r[k]) + "x" for k in ("horovod_over_bluefog", "least_favourable_pair",
                                                 "slowest_launches"))


def horovod_eager(data: str) -> str:
    recs = load(data, "allreduce_horovod", has="call")
    lines = ["| size | eager | `tf.function` | temporary | bluefog eager per call |",
             "|---|---|---|---|---|"]
    for b in sorted({r["bytes"] for r in recs if r["call"] == "eager"}):
        by = {r["call"]: r for r in recs if r["bytes"] == b}
        lines.append(f"| {size_text(b)} | {_faster(by['eager'])} | {_faster(by['tf.function'])} "
                     f"| {_faster(by['temporary'])} | {_time(by['eager']['bluefog_s'])} |")
    return "\n".join(lines)


def horovod_chain(data: str) -> str:
    recs = [r for r in load(data, "allreduce_horovod", has="call") if r.get("call") == "chain"]
    lines = ["| size | TF's call, bluefog's TF / Horovod's | bluefog per op in a chain | its time "
             "over in-place MPI | Horovod per op | bluefog faster by, per op |",
             "|---|---|---|---|---|---|"]
    for r in recs:
        om = [r["bluefog_over_mpi_in_place"], r["bluefog_over_mpi_in_place_worst"]]
        lines.append(f"| {size_text(r['bytes'])} | {r['tf_call_bluefog_s'] * 1e6:.0f} / "
                     f"{r['tf_call_horovod_s'] * 1e6:.0f} us | {_time(r['bluefog_s'])} | "
                     + " / ".join(f"{v:.2f}" if v < 100 else f"{v:.0f}" for v in om)
                     + f" | {_time(r['horovod_s'])} | {_faster(r)} |")
    return "\n".join(lines)


def gloo_one_host(data: str) -> str:
    recs = load(data, "gloo_vs_mpi_one_host")
    sizes = sorted({r["bytes"] for r in recs})
    lines = ["| ranks | " + " | ".join(size_text(b) for b in sizes) + " |",
             "|---|" + "---|" * len(sizes)]
    for n in sorted({r["ranks"] for r in recs}):
        by = {r["bytes"]: r for r in recs if r["ranks"] == n}
        cells = [f"{by[b]['gloo_over_mpi']:.2f} ({by[b]['worst_launch_ratio']:.2f})"
                 for b in sizes]
        lines.append(f"| {n}{' (on 2 cores)' if n == 3 else ''} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def gloo_hosts(data: str) -> str:
    recs = load(data, "gloo_vs_mpi_hosts")
    lines = ["| link | size | Gloo | MPI | Gloo / MPI | per round | worst launch Gloo / MPI | "
             "link floor |", "|---|---|---|---|---|---|---|---|"]
    for r in recs:
        floor = f"{r['link_floor_s'] * 1e3:.0f} ms" if r["link_floor_s"] else ""
        lines.append(f"| {r['link']} | {size_text(r['bytes'])} | {_ms(r['gloo_s'])} ms | "
                     f"{_ms(r['mpi_s'])} ms | {r['gloo_over_mpi']:.2f} | "
                     f"{r['per_round_min']:.2f}-{r['per_round_max']:.2f} | "
                     f"{_ms(r['gloo_worst_launch_s'])} / {_ms(r['mpi_worst_launch_s'])} ms | "
                     f"{floor} |".replace("|  |", "| |"))
    return "\n".join(lines)


TABLES = {"horovod-eager": horovod_eager, "horovod-chain": horovod_chain,
          "gloo-one-host": gloo_one_host, "gloo-hosts": gloo_hosts}


def table(name: str, data: str = DATA) -> str:
    return TABLES[name](data)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default=DATA, help="folder of results files (default docs/data)")
    p.add_argument("--out", default=os.path.join(ROOT, "build", "figures"))
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    for name in FIGURES:
        path = os.path.join(args.out, name + ".png")
        with open(path, "wb") as f:
            f.write(render(name, args.data))
        print(path)


if __name__ == "__main__":
    main()
