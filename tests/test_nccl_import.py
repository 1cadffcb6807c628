"""nccl-tests import: text (several collectives and types, in/out-of-place, N/A, device lines) and -J JSON.

The samples under tests/data were written from nccl-tests' documented output format (src/util.cu:
`%12li  %12li  %8s  %6s  %6s` preamble, then time/algbw/busbw/#wrong per placement); the checks
below compare the imported rows with the file's own text and with the nccl-tests formulas. Real logs and
every other input form: tests/test_nccl_import_forms.py.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pandas as pd
import pytest

import commbench
from commbench.store.nccl_import import NCCL_TYPES, import_log, import_nccl_tests, nccl_version_string

DATA = Path(__file__).parent / "data"
ROW_RE = re.compile(r"^\s*\d+\s+\d+\s+\w+\s+\w+\s+-?\d+\s")


def data_rows(path: Path) -> list[list[str]]:
    """The data lines of a text sample, split, read independently of the importer."""
    return [ln.split() for ln in path.read_text().splitlines() if ROW_RE.match(ln)]


def bus_factor(coll: str, n: int) -> float:
    # nccl-tests doc/PERFORMANCE.md
    return {"all_reduce": 2 * (n - 1) / n, "all_gather": (n - 1) / n, "reduce_scatter": (n - 1) / n}[coll]


def test_all_reduce_text_rows_match_file(tmp_path: Path) -> None:
    src = DATA / "nccl_all_reduce_float.txt"
    out = import_nccl_tests(src, tmp_path / "run")
    df = commbench.load(out)
    lines = data_rows(src)
    assert len(df) == 2 * len(lines)  # one row per placement
    oop = df[df["placement"] == "out-of-place"].sort_values("size_bytes")
    inp = df[df["placement"] == "in-place"].sort_values("size_bytes")
    for (_, o), (_, i), toks in zip(oop.iterrows(), inp.iterrows(), lines, strict=True):
        assert o["size_bytes"] == int(toks[0]) and o["count"] == int(toks[1])
        assert (o["time_us"], o["algbw_gbps"], o["busbw_gbps"], o["wrong"]) == tuple(map(float, toks[5:9]))
        assert (i["time_us"], i["algbw_gbps"], i["busbw_gbps"], i["wrong"]) == tuple(map(float, toks[9:13]))
    assert set(df["collective"]) == {"all_reduce"}
    assert set(df["precision"]) == {"fp32"} and set(df["dtype"]) == {"float"}
    assert set(df["impl"]) == {"nccl-tests"} and set(df["backend"]) == {"nccl"}
    # 4 device lines on 2 hosts
    assert set(df["world_size"]) == {4} and set(df["nodes"]) == {2}
    # the file's busbw/algbw ratio is nccl-tests' all_reduce factor 2(n-1)/n = 1.5 (2-decimal rounding)
    big = df[df["algbw_gbps"] > 1]
    assert ((big["busbw_gbps"] / big["algbw_gbps"] - 1.5).abs() < 0.01).all()
    # all_reduce size is the whole buffer: count x 4 bytes; fp32_bytes is then the same
    assert (df["size_bytes"] == df["count"] * 4).all()
    assert (df["fp32_bytes"] == df["size_bytes"]).all()
    for col in ("encode_us", "decode_us", "rel_err", "effective_gbps"):
        assert df[col].isna().all()
    meta = commbench.load_metadata(out)
    assert meta["launcher"] == "import" and meta["backend"] == "nccl"
    assert meta["world_size"] == 4 and meta["nodes"] == 2 and meta["nproc_per_node"] == 2
    assert meta["hosts"] == ["gpu-a01", "gpu-a02"] and meta["host"] == "gpu-a01"
    assert meta["device_name"] == "NVIDIA H100 80GB HBM3"
    assert meta["nccl_version"] == "2.23.4"  # nccl-library=22304
    assert (out / "results.csv").is_file() and (out / "results.parquet").is_file()


def test_several_collectives_and_types_in_one_file(tmp_path: Path) -> None:
    src = DATA / "nccl_multi.txt"
    df = commbench.load(import_nccl_tests(src, tmp_path / "run"))
    assert len(df) == 2 * len(data_rows(src))
    got = df.groupby("collective")[["dtype", "precision"]].first().to_dict("index")
    assert got == {
        "all_gather": {"dtype": "half", "precision": "fp16"},
        "reduce_scatter": {"dtype": "bfloat16", "precision": "bf16"},
        "all_reduce": {"dtype": "f8e4m3", "precision": "fp8_e4m3"},
    }
    # '-c 0' printed N/A in #wrong: missing, not zero
    assert df[df["collective"] == "all_gather"]["wrong"].isna().all()
    assert (df[df["collective"] != "all_gather"]["wrong"] == 0).all()
    n = 8
    assert set(df["world_size"]) == {n} and set(df["nodes"]) == {1}
    for coll in ("all_gather", "reduce_scatter", "all_reduce"):
        d = df[df["collective"] == coll]
        width = NCCL_TYPES[d["dtype"].iloc[0]][1]
        # nccl-tests 'size': all_gather total output / reduce_scatter total input = count x n x width
        per = n if coll != "all_reduce" else 1
        assert (d["size_bytes"] == d["count"] * per * width).all()
        big = d[d["algbw_gbps"] > 5]
        assert ((big["busbw_gbps"] / big["algbw_gbps"] - bus_factor(coll, n)).abs() < 0.01).all()
    assert commbench.load_metadata(tmp_path / "run")["nccl_version"] == "2.27.3"


def test_collective_inferred_from_rows_without_binary_names(tmp_path: Path) -> None:
    df = commbench.load(import_nccl_tests(DATA / "nccl_bare_rows.txt", tmp_path / "run"))
    by_type = df.groupby("dtype")["collective"].unique().to_dict()
    # redop sum + size == count x width -> all_reduce; size == count x n x width -> reduce_scatter
    assert list(by_type["float"]) == ["all_reduce"] and list(by_type["int32"]) == ["reduce_scatter"]
    # no device lines: world size from size/count (reduce_scatter) and busbw/algbw (all_reduce)
    assert set(df["world_size"].dropna()) == {2}
    assert set(df["precision"]) == {"fp32", "int32"}


def test_all_gather_vs_all_to_all_needs_collective_option(tmp_path: Path) -> None:
    src = DATA / "nccl_bare_all_gather.txt"
    with pytest.raises(ValueError, match="--collective"):
        import_nccl_tests(src, tmp_path / "a")
    df = commbench.load(import_nccl_tests(src, tmp_path / "b", collective="all_gather"))
    assert set(df["collective"]) == {"all_gather"}
    df = commbench.load(import_nccl_tests(src, tmp_path / "c", collective="alltoall"))
    assert set(df["collective"]) == {"all_to_all"}


def test_json_import_matches_json_values(tmp_path: Path) -> None:
    src = DATA / "nccl_reduce_scatter.json"
    doc = json.loads(src.read_text())
    df = commbench.load(import_nccl_tests(src, tmp_path / "run"))
    assert len(df) == 2 * len(doc["results"])
    assert set(df["collective"]) == {"reduce_scatter"}  # from args[0]
    for r in doc["results"]:
        for key, placement in (("out_of_place", "out-of-place"), ("in_place", "in-place")):
            row = df[(df["size_bytes"] == r["size"]) & (df["dtype"] == r["type"]) & (df["placement"] == placement)]
            assert len(row) == 1
            row = row.iloc[0]
            assert row["count"] == r["count"]
            assert row["time_us"] == r[key]["time"]
            assert row["busbw_gbps"] == r[key]["bus_bw"] and row["algbw_gbps"] == r[key]["alg_bw"]
            if r[key]["nwrong"] is None:
                assert math.isnan(row["wrong"])
            else:
                assert row["wrong"] == r[key]["nwrong"]
            assert row["iters"] == r["actual_iterations"]
    assert set(df["world_size"]) == {4} and set(df["nodes"]) == {2}
    meta = commbench.load_metadata(tmp_path / "run")
    assert meta["nccl_version"] == "2.27.3" and meta["device_name"] == "NVIDIA H200"


def test_malformed_row_is_skipped_and_reported(tmp_path: Path) -> None:
    src = DATA / "nccl_malformed.txt"
    lines = src.read_text().splitlines()
    # the broken row: a data line with 12 fields where the header promises 13
    bad = next(i for i, ln in enumerate(lines, 1) if ROW_RE.match(ln) and len(ln.split()) == 12)
    header = next(i for i, ln in enumerate(lines, 1) if "size" in ln and "count" in ln)
    res = import_log(src, tmp_path / "run")
    df = commbench.load(res.runs[0])
    assert len(df) == 2 * (len(data_rows(src)) - 1)  # every other row is read
    skipped = commbench.load_metadata(res.runs[0])["skipped_lines"]
    assert skipped == [{"line": bad, "reason": f"12 columns where the header at line {header} has 13"}]
    assert any(f"line(s) {bad}" in x for x in res.warnings)


def test_bad_inputs_raise_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not exist"):
        import_nccl_tests(tmp_path / "missing.txt", tmp_path / "a")
    empty = tmp_path / "empty.txt"
    empty.write_text("# nothing here\n")
    with pytest.raises(ValueError, match="no nccl-tests result rows"):
        import_nccl_tests(empty, tmp_path / "b")
    bad_json = tmp_path / "bad.json"
    bad_json.write_text('{"version": 2,\n "results": [\n {"size": 8,, }]}')
    with pytest.raises(ValueError, match="^line 3: malformed nccl-tests JSON"):
        import_nccl_tests(bad_json, tmp_path / "c")
    bad_type = tmp_path / "type.txt"
    bad_type.write_text(
        "#  size  count  type  redop  root  time  algbw  busbw  #wrong\n"
        "    1024    256  float16  sum  -1  10.0  0.10  0.10  0\n"
    )
    with pytest.raises(ValueError, match="line 2: unknown nccl-tests data type 'float16'"):
        import_nccl_tests(bad_type, tmp_path / "d")
    with pytest.raises(ValueError, match="unknown collective 'allreduced'; choose one of all_gather, all_reduce"):
        import_nccl_tests(DATA / "nccl_all_reduce_float.txt", tmp_path / "e", collective="allreduced")


def test_never_overwrites_a_non_empty_out_dir(tmp_path: Path) -> None:
    out = tmp_path / "run"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(ValueError, match="not empty"):
        import_nccl_tests(DATA / "nccl_all_reduce_float.txt", out)
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt"]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert import_nccl_tests(DATA / "nccl_all_reduce_float.txt", empty) == empty


def test_optional_layouts_old_header_trace_replay_timestamps(tmp_path: Path) -> None:
    # old nccl-tests: no root column, 'error' (max error) instead of #wrong; a blank out-of-place
    # group (trace replay); a trailing timestamp column.
    old = tmp_path / "old.txt"
    old.write_text(
        "#  size  count  type  redop  time  algbw  busbw  error  time  algbw  busbw  error\n"
        "   4096   1024  float  sum  20.00  0.20  0.20  1e-06  21.00  0.20  0.20  0e+00\n"
    )
    df = commbench.load(import_nccl_tests(old, tmp_path / "a", collective="all_reduce"))
    assert sorted(df["max_abs_err"]) == [0.0, 1e-06] and df["wrong"].isna().all()
    replay = tmp_path / "replay.txt"
    replay.write_text(
        "# Collective test starting: all_reduce_perf\n"
        "#  size  count  type  redop  root  time  algbw  busbw  #wrong  time  algbw  busbw  #wrong  timestamp\n"
        "   4096   1024  float  sum  -1   21.00  0.20  0.20  0  2026-01-01 10:00:00\n"
    )
    df = commbench.load(import_nccl_tests(replay, tmp_path / "b"))
    assert list(df["placement"]) == ["in-place"] and df["time_us"].iloc[0] == 21.0


def test_nccl_version_codes() -> None:
    # NCCL_VERSION_CODE: X*10000+Y*100+Z since 2.9, X*1000+Y*100+Z before
    assert nccl_version_string(22703) == "2.27.3"
    assert nccl_version_string(21805) == "2.18.5"
    assert nccl_version_string(2804) == "2.8.4"


def test_imported_run_loads_like_a_commbench_run(tmp_path: Path) -> None:
    out = import_nccl_tests(DATA / "nccl_multi.txt", tmp_path / "run")
    df = commbench.load(out)
    # every results-schema column is present, extras after them
    assert list(df.columns[: len(commbench.store.results.COLUMNS)]) == list(commbench.store.results.COLUMNS)
    assert {"placement", "redop", "root"} <= set(df.columns)
    assert pd.api.types.is_integer_dtype(df["size_bytes"])
