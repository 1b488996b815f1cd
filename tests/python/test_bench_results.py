"""Benchmark results files (bench/results.py): what `--out` writes reads back, and every file in
docs/data/ (drawn by `make docs`) is one, with the fields its figure and table read; the
timeline there is a merged 2-rank Chrome trace. Single process, no TensorFlow."""

from __future__ import annotations

import glob
import importlib.util
import json
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# From its file: bench/ on sys.path would shadow modules of other tests (bench/run.py).
_spec = importlib.util.spec_from_file_location("bluefog_bench_results",
                                               os.path.join(ROOT, "bench", "results.py"))
results = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(results)

# The fields docs/figures.py reads from each file.
FIELDS = {
    "allreduce_horovod": {"call", "bytes", "horovod_over_bluefog", "least_favourable_pair",
                          "slowest_launches"},
    "gloo_vs_mpi_one_host": {"ranks", "bytes", "gloo_over_mpi", "worst_launch_ratio"},
    "gloo_vs_mpi_hosts": {"link", "bytes", "gloo_s", "mpi_s", "link_floor_s"},
    "training_step": {"model", "framework", "step_s", "step_worst_s", "compute_only_s",
                      "tf_alone_s", "over_tf_alone_pct", "scaling_efficiency"},
    "tta_hosts": {"method", "label", "round", "time_to_target_s", "target"},
    "elastic_recovery": {"mode", "event", "min_s", "max_s"},
}


def test_write_then_read(tmp_path):
    path = str(tmp_path / "out" / "r.json")
    results.write(path, "example", [{"impl": "x", "bytes": 4, "median_s": 1e-5,
                                     "ms": {"fp16": 1.5}, "per_rank": [1, 2]}], "notes")
    doc = results.read(path)
    assert doc["format"] == results.FORMAT and doc["bench"] == "example"
    assert doc["records"] == [{"impl": "x", "bytes": 4, "median_s": 1e-5, "ms.fp16": 1.5,
                               "per_rank.0": 1, "per_rank.1": 2}]
    with pytest.raises(ValueError, match="scalars"):
        results.write(path, "example", [{"x": object()}])
    with open(path, "w") as f:
        json.dump({"records": []}, f)
    with pytest.raises(ValueError, match="not a bluefog-bench/1 results file"):
        results.read(path)


def test_published_data_files():
    names = {os.path.basename(p)[:-5] for p in glob.glob(os.path.join(ROOT, "docs", "data",
                                                                      "*.json"))}
    assert names == set(FIELDS) | {"timeline"}, names
    for name, fields in FIELDS.items():
        doc = results.read(os.path.join(ROOT, "docs", "data", name + ".json"))
        assert doc["records"], name
        for r in doc["records"]:
            assert fields <= set(r), (name, fields - set(r))


def test_published_timeline_is_a_two_rank_trace():
    with open(os.path.join(ROOT, "docs", "data", "timeline.json")) as f:
        events = json.load(f)
    spans = [e for e in events if e["ph"] == "X"]
    assert {e["pid"] for e in spans} == {0, 1}
    assert {"QUEUE", "NEGOTIATE", "allreduce"} <= {e["name"] for e in spans}
    assert os.path.getsize(os.path.join(ROOT, "docs", "data", "timeline.json")) < 64 << 10
