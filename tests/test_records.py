"""Typed records: columns, dtypes and docs derive from the dataclass; the run-directory writer and loader
handle any Record type (a test-only column and a test-only table travel writer -> CSV/parquet -> loader);
schema-1 run directories (the committed example) still load; --resume turns journal rows back into records.

Recipe "add a column" (what ARCHITECTURE.md documents): declare the field on the record with ``col(doc)``
and fill it where the record is built. Here the column is added from this file alone, by subclassing the
record for the same table, which is also how an importer adds its own columns (nccl_import.NcclTestsPoint).
"""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pandas as pd
import pytest

import commbench
from commbench.cluster.metadata import build_metadata
from commbench.core.records import SCHEMA_VERSION, CollectivePoint, Record, col, record_for_table
from commbench.store.results import RunWriter, load, load_table, read_journal

EXAMPLE = Path(__file__).resolve().parents[1] / "results" / "examples" / "quick"


@dataclass(kw_only=True, slots=True)
class QueuedPoint(CollectivePoint):
    """A results row with one more column (test-only)."""

    TABLE: ClassVar[str] = "results"
    queue_depth: int = col("operations in flight when the point was timed (test-only column)")
    tag: str | None = col("free-form label (test-only column)", default=None)


@dataclass(kw_only=True, slots=True)
class ToyRow(Record):
    """A whole new table (test-only)."""

    TABLE: ClassVar[str] = "toy_table"
    name: str = col("a name")
    hits: int | None = col("a count that may be unknown")
    ratio: float = col("a fraction")
    ok: bool = col("a flag")


def point(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = dict(
        collective="all_reduce", precision="fp32", impl="native", backend="gloo", device="cpu", world_size=2,
        nodes=1, payload="normal", dtype="float", size_bytes=4096, count=1024, fp32_bytes=4096, wire_bytes=4096,
        time_us=10.0, time_us_max=11.0, p50_us=10.0, p95_us=12.0, cv=0.05, rank_spread=0.1, iters=8, samples=5,
        algbw_gbps=0.4096, busbw_gbps=0.4096, encode_us=0.0, comm_us=10.0, decode_us=0.0, total_us=10.0,
        effective_gbps=0.4096, wrong=0, tolerance=0.0, rel_err=0.0, max_abs_err=0.0, timestamp="2026-01-01T00:00:00+00:00",
    )  # fmt: skip
    base.update(over)
    return base


def test_columns_match_the_schema_1_example_header() -> None:
    # independent reference: the header line of a results.csv written before records existed
    header = (EXAMPLE / "results.csv").read_text().splitlines()[0].split(",")
    # columns added since schema 1, each with a default so old rows still load
    added = [
        "comm_rel_err", "group", "group_size", "n_groups", "time_ci_low_us", "time_ci_high_us", "ci_coverage",
        "noisy", "busbw_ci_low_gbps", "busbw_ci_high_gbps", "total_ci_low_us", "total_ci_high_us",
        "effective_ci_low_gbps", "effective_ci_high_gbps", "gain_vs_fp32", "gain_ci_low", "gain_ci_high",
        "gain_significant", "algo_gain", "algo_gain_ci_low", "algo_gain_ci_high", "precision_gain",
        "precision_gain_ci_low", "precision_gain_ci_high", "timing_mode", "link_gbps", "link_util", "link",
        "link_host", "passes_done", "partial", "redop", "root",
    ]  # fmt: skip
    assert [c for c in CollectivePoint.columns() if c not in added] == header
    assert [c for c in commbench.store.results.COLUMNS if c not in added] == header
    defaults = CollectivePoint.defaults()
    assert all(c in defaults for c in added)
    assert commbench.store.results.POINT_KEY == ("collective", "precision", "payload", "fp32_bytes", "group")
    assert record_for_table("results") is CollectivePoint  # a subclass does not take the table over


def test_dtypes_and_docs_derive_from_the_fields() -> None:
    assert ToyRow.columns() == ("name", "hits", "ratio", "ok")
    assert ToyRow.dtypes() == {"name": "object", "hits": "Int64", "ratio": "float64", "ok": "bool"}
    dt = CollectivePoint.dtypes()
    assert dt["size_bytes"] == dt["world_size"] == "int64" and dt["time_us"] == "float64"
    assert dt["collective"] == "object"
    docs = CollectivePoint.docs()
    assert set(docs) == set(CollectivePoint.columns())
    for name, doc in docs.items():
        assert doc and "\n" not in doc, name
        # units: in the name, and said in the doc
        if name.endswith("_us"):
            assert "microseconds" in doc, name
        if name.endswith("_gbps"):
            assert "GB/s" in doc, name
        if name.endswith("_bytes"):
            assert "bytes" in doc, name
    assert QueuedPoint.columns()[-2:] == ("queue_depth", "tag")
    assert QueuedPoint.docs()["queue_depth"].startswith("operations in flight")


def _new_writer(run: Path) -> RunWriter:
    """A writer of a new run directory with its metadata written (a 2-rank local gloo run)."""
    w = RunWriter(run)
    w.write_metadata(build_metadata(
        start_time="t0", end_time=None, host="h", hosts=["h"], device_name="cpu", backend="gloo", world_size=2,
        nodes=1, nproc_per_node=2, threads_per_rank=1, launcher="local", torch_version=None, nccl_version=None,
        suite={}, timing={}, argv=[],
    ))  # fmt: skip
    return w


def test_added_column_travels_writer_csv_parquet_loader(tmp_path: Path) -> None:
    run = tmp_path / "run"
    w = _new_writer(run)
    rows = [QueuedPoint(**point(fp32_bytes=b, queue_depth=d), tag=t) for b, d, t in ((1024, 1, "a"), (4096, 3, None))]
    w.add(rows)
    for name in ("results.csv", "results.parquet", "rows.jsonl"):
        assert (run / name).is_file(), name
    # the CSV, read with the csv text alone: the new columns after the 34 known ones
    header = (run / "results.csv").read_text().splitlines()[0].split(",")
    assert header[-2:] == ["queue_depth", "tag"] and len(header) == len(CollectivePoint.columns()) + 2
    for df in (load_table(run, QueuedPoint), pd.read_parquet(run / "results.parquet")):
        assert list(df["queue_depth"]) == [1, 3] and str(df["queue_depth"].dtype) == "int64"
        assert df["tag"].iloc[0] == "a" and pd.isna(df["tag"].iloc[1])
    # the generic loader of the base table keeps the extra column after its own
    df = load(run)
    assert list(df.columns[: len(CollectivePoint.columns())]) == list(CollectivePoint.columns()) and list(df["queue_depth"]) == [1, 3]
    # CSV only (parquet removed): same values and dtypes
    (run / "results.parquet").unlink()
    csv = load_table(run, QueuedPoint)
    assert list(csv["queue_depth"]) == [1, 3] and str(csv["queue_depth"].dtype) == "int64"
    assert str(csv["world_size"].dtype) == "int64" and csv["time_us"].tolist() == [10.0, 10.0]

    # --resume: journal rows come back as records, equal to what was written
    w2 = RunWriter(run, resume=True)
    assert w2.records(QueuedPoint) == rows
    assert w2.done_keys() == {("all_reduce", "fp32", "normal", 1024, "world"), ("all_reduce", "fp32", "normal", 4096, "world")}
    w2.add([QueuedPoint(**point(fp32_bytes=16384, queue_depth=7))])
    assert len(read_journal(run / "rows.jsonl")) == 3
    assert list(load_table(run, QueuedPoint)["queue_depth"]) == [1, 3, 7]


def test_new_table_by_type_and_by_name(tmp_path: Path) -> None:
    run = tmp_path / "run"
    w = RunWriter(run)
    (run / "metadata.json").write_text(json.dumps({"schema_version": SCHEMA_VERSION}))
    w.add([ToyRow(name="x", hits=3, ratio=0.5, ok=True), ToyRow(name="y", hits=None, ratio=math.nan, ok=False)])
    assert {p.name for p in run.iterdir()} >= {"toy_table.jsonl", "toy_table.csv", "toy_table.parquet"}
    for df in (load_table(run, ToyRow), load_table(run, "toy_table")):
        assert list(df.columns) == ["name", "hits", "ratio", "ok"]
        assert str(df["hits"].dtype) == "Int64" and df["hits"].iloc[0] == 3 and pd.isna(df["hits"].iloc[1])
        assert df["ok"].tolist() == [True, False] and str(df["ok"].dtype) == "bool"
    (run / "toy_table.parquet").unlink()
    (run / "toy_table.csv").unlink()
    df = load_table(run, ToyRow)  # from the journal alone
    assert df["name"].tolist() == ["x", "y"] and str(df["hits"].dtype) == "Int64"
    with pytest.raises(TypeError, match="one record type"):
        w.add([ToyRow(name="z", hits=1, ratio=0.0, ok=True), QueuedPoint(**point(queue_depth=1))])


def test_schema_1_example_still_loads(tmp_path: Path) -> None:
    assert json.loads((EXAMPLE / "metadata.json").read_text())["schema_version"] == 1 < SCHEMA_VERSION
    csv_lines = (EXAMPLE / "results.csv").read_text().splitlines()
    journal = [ln for ln in (EXAMPLE / "rows.jsonl").read_text().splitlines() if ln.strip()]
    df = commbench.load(EXAMPLE)
    assert len(df) == len(csv_lines) - 1 == len(journal)
    assert df["collective"].tolist() == [json.loads(ln)["collective"] for ln in journal]
    assert df["size_bytes"].tolist() == [json.loads(ln)["size_bytes"] for ln in journal]
    # schema 1 wrote training tables as CSV only
    assert not (EXAMPLE / "training.parquet").exists()
    training = commbench.load_training(EXAMPLE)
    assert len(training) == len((EXAMPLE / "training.csv").read_text().splitlines()) - 1 > 0
    assert all(isinstance(w, str) for w in training["warnings"])
    # columns added since (issue 24: parallelism, reference_policy) read back missing, not as an error
    assert {"parallelism", "reference_policy"} <= set(training.columns) and training["reference_policy"].isna().all()
    assert len(commbench.load_training_steps(EXAMPLE)) > 0
    assert list(commbench.load_crossover(EXAMPLE).columns) == list(commbench.store.results.CROSSOVER_COLUMNS)
    # a schema-1 directory reduced to its journals (no CSV, no parquet) loads the same rows
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("metadata.json", "rows.jsonl", "training.jsonl"):
        shutil.copy(EXAMPLE / name, bare / name)
    again = commbench.load(bare)
    pd.testing.assert_frame_equal(again[["collective", "precision", "size_bytes", "wrong"]], df[["collective", "precision", "size_bytes", "wrong"]])
    assert len(commbench.load_training(bare)) == len(training)
    # --resume of a schema-1 directory reads its journal back as records
    w = RunWriter(bare, resume=True)
    recs = w.records(CollectivePoint)
    assert len(recs) == len(journal) and recs[0].collective == df["collective"].iloc[0]


def test_metadata_builder_has_what_every_run_states() -> None:
    meta = build_metadata(
        start_time="t0", end_time="t1", host="h", hosts=["h"], device_name="cpu", backend="gloo", world_size=2,
        nodes=1, nproc_per_node=2, threads_per_rank=1, launcher="local", torch_version="2.x", nccl_version=None,
        suite={"name": "s"}, timing={"warmup": 1}, argv=["commbench"], extra={"imported_from": "f"},
    )  # fmt: skip
    # DESIGN: versions, host and device, world layout, suite, timing, time
    for key in ("schema_version", "commbench_version", "python_version", "platform", "torch_version", "host",
                "device_name", "backend", "world_size", "nodes", "suite", "timing", "start_time", "argv"):  # fmt: skip
        assert key in meta, key
    assert meta["schema_version"] == SCHEMA_VERSION == 2 and meta["imported_from"] == "f"


def test_tables_follow_the_journal_between_rewrites_and_at_flush(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The journal takes every row at once; CSV and parquet are rewritten at most every TABLE_EVERY_S and at flush.
    A writer killed between two rewrites (the table behind its journal) still loads every journaled row."""
    import commbench.store.results as results

    clock = [100.0]
    monkeypatch.setattr(results.time, "monotonic", lambda: clock[0])
    run = tmp_path / "run"
    w = _new_writer(run)
    w.add([CollectivePoint(**point(fp32_bytes=1024))])  # the first add writes the tables at once
    assert len(pd.read_parquet(run / "results.parquet")) == 1
    clock[0] += results.TABLE_EVERY_S / 2
    w.add([CollectivePoint(**point(fp32_bytes=4096))])  # within the interval: journal only
    assert len(pd.read_parquet(run / "results.parquet")) == 1 and len(pd.read_csv(run / "results.csv")) == 1
    assert len(read_journal(run / "rows.jsonl")) == 2
    assert sorted(load(run)["fp32_bytes"]) == [1024, 4096]  # the lagging table is not what load returns
    clock[0] += results.TABLE_EVERY_S
    w.add([CollectivePoint(**point(fp32_bytes=16384))])  # past the interval: rewritten with every row
    assert sorted(pd.read_parquet(run / "results.parquet")["fp32_bytes"]) == [1024, 4096, 16384]
    w.add([CollectivePoint(**point(fp32_bytes=4096, time_us=20.0))])  # a point's final row replaces its first
    w.flush()
    for df in (pd.read_parquet(run / "results.parquet"), pd.read_csv(run / "results.csv"), load(run)):
        assert list(df["fp32_bytes"]) == [1024, 16384, 4096] and list(df["time_us"]) == [10.0, 10.0, 20.0]
    w.flush()  # idempotent: nothing stale, nothing rewritten
