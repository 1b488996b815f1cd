"""The one file format of benchmark results: what `--out FILE` writes in the bench scripts, what
docs/data/ holds and what docs/figures.py plots (docs/benchmarks.md, "Data files").

A results file is one JSON object:

    {"format": "bluefog-bench/1",
     "bench": "gloo_vs_mpi",             # the script (or table) the records come from
     "date": "2026-12-07",               # when it was measured (UTC)
     "command": "bench/gloo_vs_mpi.py ...",
     "machine": "2-core VM, ...",        # free text: where it ran
     "notes": "...",                     # free text: how to read the records
     "records": [{...}, ...]}            # one flat object per measurement

A record holds only strings, numbers, booleans and null. Times are in seconds and their keys end
in `_s`, sizes are in bytes under `bytes`, ratios are plain numbers; the other keys say which
measurement it is (`backend`, `framework`, `ranks`, `link`, ...).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys

FORMAT = "bluefog-bench/1"


def add_out_option(parser: argparse.ArgumentParser) -> None:
    """`--out FILE`: also write the results there (this module's format)."""
    parser.add_argument("--out", metavar="FILE.json", default="",
                        help="also write the results to FILE.json (format: bench/results.py)")


def flatten(record: dict, prefix: str = "") -> dict:
    """A record with nested objects and lists as dotted keys ({"ms": {"fp16": 1}, "t": [2]} ->
    {"ms.fp16": 1, "t.0": 2})."""
    out = {}
    for k, v in record.items():
        if isinstance(v, (list, tuple)):
            v = {str(i): x for i, x in enumerate(v)}
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def write(path: str, bench: str, records: list, notes: str = "") -> None:
    """Writes `records` to `path` with today's date, the command and the host. Nested objects
    and lists are flattened (flatten); any other value that is not a scalar raises ValueError."""
    records = [flatten(r) for r in records]
    for r in records:
        bad = {k: v for k, v in r.items()
               if v is not None and not isinstance(v, (str, int, float, bool))}
        if bad:
            raise ValueError(f"record fields must be scalars, got {bad}")
    doc = {"format": FORMAT, "bench": bench,
           "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
           "command": " ".join([os.path.relpath(sys.argv[0])] + sys.argv[1:]),
           "machine": f"{platform.node()}: {os.cpu_count()} cores, {platform.platform()}",
           "notes": notes, "records": records}
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print(f"(results in {path})", flush=True)


def read(path: str) -> dict:
    """A results file, checked: raises ValueError naming the file when it is not one."""
    with open(path) as f:
        doc = json.load(f)
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ValueError(f"{path}: not a {FORMAT} results file")
    for key in ("bench", "date", "records"):
        if key not in doc:
            raise ValueError(f"{path}: no {key!r}")
    return doc
