"""Every input form of nccl-tests / rccl-tests output, read right (issue 26 items 1-5).

Real logs (tests/data/nccl_real, cited in SOURCES.md) are checked against their own text, split independently of
the importer, and against nccl-tests' formulas (bus factor 2(n-1)/n, algbw = size / time). The forms no public log
shows are written by ``tests/nccl_writers.py``, a port of nccl-tests' and rccl-tests' own writers; the checks then
compare the import with the values the writer put in (never with the importer's earlier output).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pandas as pd
import pytest

import commbench
from commbench.store.nccl_import import import_log
from tests import nccl_writers as w
from tests.cli_util import commbench as run_cli

REAL = Path(__file__).parent / "data" / "nccl_real"
GCP = REAL / "gcp_a3mega_2node_16rank_all_reduce.txt"
ROW = re.compile(r"^\s*\d+\s+\d+\s+\w+\s+\w+\s+-?\d+\s")


def table_rows(text: str) -> list[list[str]]:
    """The complete data rows of a text log, split on whitespace after removing launcher tags (not the importer's
    code: a plain regex per line)."""
    out = []
    for ln in text.splitlines():
        ln = re.sub(r"\[\d+\]|\[\d+,\d+\]<stdout>:", " ", ln)
        if ROW.match(ln) and len(ln.split()) == 13:
            out.append(ln.split())
    return out


def factor_bounds(bus: str, alg: str) -> tuple[float, float]:
    """The busbw/algbw ratios the two printed numbers allow (each within half a unit of its last digit)."""
    db = 0.5 * 10 ** -len(bus.split(".")[1]) if "." in bus else 0.5
    da = 0.5 * 10 ** -len(alg.split(".")[1]) if "." in alg else 0.5
    return (float(bus) - db) / (float(alg) + da), (float(bus) + db) / (float(alg) - da)


def ring(n: int) -> float:
    return 2 * (n - 1) / n  # nccl-tests doc/PERFORMANCE.md, all_reduce


def placement(df: pd.DataFrame, p: str) -> pd.DataFrame:
    return df[df["placement"] == p].sort_values(["size_bytes", "cycle"]).reset_index(drop=True)


# --- item 1: world size --------------------------------------------------------------------------------------


def test_real_two_node_log_reads_every_row(tmp_path: Path) -> None:
    text = GCP.read_text()
    res = import_log(GCP, tmp_path / "run")
    assert res.runs == [tmp_path / "run"] and res.warnings == []
    df = commbench.load(res.runs[0])
    rows = table_rows(text)
    assert len(rows) == 31 and len(df) == 62
    for placement_name, at in (("out-of-place", 5), ("in-place", 9)):
        got = placement(df, placement_name)
        for (_, r), toks in zip(got.iterrows(), rows, strict=True):
            assert (r["size_bytes"], r["count"]) == (int(toks[0]), int(toks[1]))
            assert (r["time_us"], r["algbw_gbps"], r["busbw_gbps"], r["wrong"]) == tuple(map(float, toks[at : at + 4]))
    meta = commbench.load_metadata(res.runs[0])
    assert set(df["world_size"]) == {16} and meta["world_size"] == 16
    assert meta["nodes"] == 2 and meta["nproc_per_node"] == 8 and meta["hosts"] == ["node-a", "node-b"]
    assert set(df["collective"]) == {"all_reduce"}  # from "all_reduce_perf" in the quoted command line
    # the log's own ratios allow 16 ranks and neither 15 nor 17 (the rows that print enough digits)
    big = [t for t in rows if float(t[6]) > 50]
    assert all(lo <= ring(16) <= hi for lo, hi in (factor_bounds(t[7], t[6]) for t in big))
    assert not all(lo <= ring(15) <= hi for lo, hi in (factor_bounds(t[7], t[6]) for t in big))
    assert not all(lo <= ring(17) <= hi for lo, hi in (factor_bounds(t[7], t[6]) for t in big))


def test_a_log_keeping_only_two_device_lines_is_still_16_ranks(tmp_path: Path) -> None:
    kept = [ln for ln in GCP.read_text().splitlines() if not re.match(r"#\s+Rank\s+(\d+)", ln) or
            re.match(r"#\s+Rank\s+(7|15)\s", ln)]  # fmt: skip
    src = tmp_path / "ranks_7_15.txt"
    src.write_text("\n".join(kept) + "\n")
    res = import_log(src, tmp_path / "run")
    df = commbench.load(res.runs[0])
    assert set(df["world_size"]) == {16}
    assert any("2 device line(s) listed" in x and "16" in x for x in res.warnings)
    meta = commbench.load_metadata(res.runs[0])
    assert meta["world_size"] == 16 and meta["nodes"] is None  # two hosts seen, but not every rank's
    assert meta["hosts"] == ["node-a", "node-b"]


def test_gb200_rack_log_with_one_device_line_reads_72_ranks(tmp_path: Path) -> None:
    src = REAL / "coreweave_gb200_nvl72_rank71_only.txt"
    res = import_log(src, tmp_path / "run")
    df = commbench.load(res.runs[0])
    assert set(df["world_size"]) == {72}
    rows = table_rows(src.read_text())
    for n, ok in ((72, True), (71, False), (73, False)):
        assert all(lo <= ring(n) <= hi for lo, hi in (factor_bounds(t[7], t[6]) for t in rows)) is ok


# --- item 2: logs that start with "[" --------------------------------------------------------------------------


def test_open_mpi_tag_output_is_text_and_the_cut_row_is_reported(tmp_path: Path) -> None:
    src = REAL / "aws_k8s_tester_tag_output.txt"
    assert src.read_text().startswith("[1,0]<stdout>:")
    r = run_cli("import", "nccl-tests", str(src), "--out", str(tmp_path / "run"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    df = commbench.load(tmp_path / "run")
    rows = table_rows(src.read_text())
    assert len(rows) == 3 and len(df) == 6
    assert list(placement(df, "in-place")["time_us"]) == [float(t[9]) for t in rows]
    meta = commbench.load_metadata(tmp_path / "run")
    # the last line of the excerpt is a row cut after its count: listed, with its reason, in metadata and on stderr
    assert [s["line"] for s in meta["skipped_lines"]] == [7]
    assert "skipped 1 line(s)" in r.stderr and "line(s) 7" in r.stderr
    # all bandwidths print as 0.00: the world size is unknown, and said so
    assert df["world_size"].isna().all() and "do not fix the world size" in r.stderr


def test_rank_tags_inside_lines(tmp_path: Path) -> None:
    """mpirun tagged every write with "[0]", so each row carries three tags mid-line."""
    src = REAL / "nccl_issue1453_rank_tags.txt"
    res = import_log(src, tmp_path / "run")
    df = commbench.load(res.runs[0])
    rows = table_rows(src.read_text())
    assert len(rows) == 10 and len(df) == 20
    got = placement(df, "out-of-place")
    assert list(got["size_bytes"]) == [int(t[0]) for t in rows]
    assert list(got["busbw_gbps"]) == [float(t[7]) for t in rows]
    assert list(placement(df, "in-place")["time_us"]) == [float(t[9]) for t in rows]
    # 24 ranks (the log's own "nRanks 24 nNodes 3"), from the rows' ratios alone
    assert set(df["world_size"]) == {24}
    assert all(lo <= ring(24) <= hi for lo, hi in (factor_bounds(t[7], t[6]) for t in rows if float(t[6]) > 10))
    # the excerpt's first line (the end of a row whose start is not in it) and its cut last line
    skipped = commbench.load_metadata(res.runs[0])["skipped_lines"]
    assert [s["line"] for s in skipped] == [6, 17]


# --- item 5: rows broken by NCCL log lines ---------------------------------------------------------------------

LOG_LINE = "node-a:1001:1001 [0] NCCL INFO 131072 Bytes -> Algo 0 proto 1 time 51.603912"
"""An NCCL_DEBUG=INFO line as NCCL prints it while an op runs (the form of one in NVIDIA/nccl#1453, host and pid
replaced)."""


def _measures(k: int = 6) -> list[w.Measure]:
    """Sizes and times of the real 16-rank log (its out-of-place and in-place times from 1 MiB up)."""
    rows = table_rows(GCP.read_text())[17 : 17 + k]
    return [w.Measure(int(t[0]), {"out-of-place": float(t[5]), "in-place": float(t[9])}) for t in rows]


def test_rows_broken_by_nccl_log_lines_are_joined(tmp_path: Path) -> None:
    layout = w.Layout(procs=2, ngpus=8, hosts=("a", "b"))
    clean = w.nccl_text("all_reduce", _measures(), layout)
    broken = w.nccl_text("all_reduce", _measures(), layout, log_line=LOG_LINE)
    assert broken.count("NCCL INFO") == 12
    (tmp_path / "clean.txt").write_text(clean)
    (tmp_path / "broken.txt").write_text(broken)
    a = commbench.load(import_log(tmp_path / "clean.txt", tmp_path / "a").runs[0])
    res = import_log(tmp_path / "broken.txt", tmp_path / "b")
    b = commbench.load(res.runs[0])
    cols = ["size_bytes", "count", "placement", "time_us", "algbw_gbps", "busbw_gbps", "wrong", "world_size"]
    pd.testing.assert_frame_equal(a[cols], b[cols])
    meta = commbench.load_metadata(res.runs[0])
    assert len(meta["recovered_rows"]) == 6 and all(len(x) == 3 for x in meta["recovered_rows"])
    assert meta["skipped_lines"] == [] and "6 row(s) were split" in " ".join(res.warnings)
    # a row whose end never came (the log ends inside it) is counted, not dropped silently
    cut = broken.rsplit("\n# Out of bounds", 1)[0].rsplit("\n", 1)[0]  # the last row without its in-place body
    (tmp_path / "cut.txt").write_text(cut + "\n")
    res = import_log(tmp_path / "cut.txt", tmp_path / "c")
    skipped = commbench.load_metadata(res.runs[0])["skipped_lines"]
    assert len(skipped) == 2 and all("never completed" in s["reason"] for s in skipped)
    assert len(commbench.load(res.runs[0])) == 10


# --- item 1: -J JSON from nccl-tests' writer ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("layout", "mpi", "ranks", "entries"),
    [
        (w.Layout(procs=1, ngpus=8), False, 8, 1),  # ./all_reduce_perf -g 8
        (w.Layout(procs=1, nthreads=2, ngpus=2), False, 4, 1),  # -t 2 -g 2
        (w.Layout(procs=2, ngpus=8, hosts=("a", "b")), True, 16, 2),  # mpirun -np 2 ... -g 8
    ],
)
def test_json_world_size_is_processes_times_threads_times_gpus(
    tmp_path: Path, layout: w.Layout, mpi: bool, ranks: int, entries: int
) -> None:
    text = w.nccl_json("all_reduce", _measures(), layout, mpi=mpi)
    doc = json.loads(text)
    assert doc["version"] == 3 and len(doc["config"]["devices"]) == entries
    (tmp_path / "r.json").write_text(text)
    res = import_log(tmp_path / "r.json", tmp_path / "json")
    df = commbench.load(res.runs[0])
    assert set(df["world_size"]) == {ranks} and res.warnings == []
    for r in doc["results"]:
        for key, p in (("out_of_place", "out-of-place"), ("in_place", "in-place")):
            row = df[(df["size_bytes"] == r["size"]) & (df["placement"] == p)].iloc[0]
            assert (row["time_us"], row["algbw_gbps"], row["busbw_gbps"]) == (
                r[key]["time"],
                r[key]["alg_bw"],
                r[key]["bus_bw"],
            )
    meta = commbench.load_metadata(res.runs[0])
    assert meta["world_size"] == ranks and meta["nodes"] == len(set(layout.hosts))
    # the same run's text table gives the same world: compare finds no world-size difference
    (tmp_path / "r.txt").write_text(w.nccl_text("all_reduce", _measures(), layout))
    txt = import_log(tmp_path / "r.txt", tmp_path / "text").runs[0]
    from commbench.views.compare import compare_warnings

    assert not any("world_size" in x for x in compare_warnings([res.runs[0], txt]))


def test_json_per_iteration_data_and_cpu_time(tmp_path: Path) -> None:
    ms = _measures(3)
    for m in ms:  # 10 iterations around the measured time, slowest process first (max over processes)
        for p, t in m.times.items():
            procs = [[t * (1 + 0.01 * math.sin(k + q)) for k in range(10)] for q in range(2)]
            m.per_process[p] = procs
            m.iter_times[p] = [max(a, b) for a, b in zip(*procs, strict=True)]
    layout = w.Layout(procs=2, ngpus=8, hosts=("a", "b"))
    text = w.nccl_json("all_reduce", ms, layout, mpi=True, per_iter=True, per_iter_skip=2, cputime=True, iters=10)
    (tmp_path / "r.json").write_text(text)
    res = import_log(tmp_path / "r.json", tmp_path / "run")
    df = commbench.load(res.runs[0])
    doc = json.loads(text)
    for r in doc["results"]:
        for key, p in (("out_of_place", "out-of-place"), ("in_place", "in-place")):
            it = r[f"{key}_per_iter"]
            row = df[(df["size_bytes"] == r["size"]) & (df["placement"] == p)].iloc[0]
            assert row["time_us"] == r[key]["cpu_time"] and row["time_source"] == "cpu"
            assert (row["iter_min_us"], row["iter_max_us"], row["iter_p99_us"]) == (
                it["min_us"],
                it["max_us"],
                it["p99_us"],
            )
            assert (row["p50_us"], row["p95_us"], row["iter_avg_us"]) == (it["p50_us"], it["p95_us"], it["avg_us"])
            assert row["cv"] == pytest.approx(it["cv_pct"] / 100) and row["iter_skipped"] == 2
    iters = commbench.store.results.load_table(res.runs[0], "nccl_iterations")
    assert len(iters) == 3 * 2 * (1 + 2) * 10  # sizes x placements x (max + 2 processes) x iterations
    first = doc["results"][0]["in_place_per_iter"]
    sel = iters[(iters["size_bytes"] == doc["results"][0]["size"]) & (iters["placement"] == "in-place")]
    assert list(sel[sel["process"] == -1].sort_values("iteration")["time_us"]) == first["times_us"]
    assert list(sel[sel["process"] == 1].sort_values("iteration")["time_us"]) == first["per_process_max_times_us"][1]
    assert any("-C 1" in x for x in res.warnings)


# --- item 4 and 5: -C 1, -S 1, -I 1 -K, -N in text ---------------------------------------------------------


def test_text_cputime_timestamps_and_per_iteration_columns(tmp_path: Path) -> None:
    ms = _measures(4)
    for m in ms:
        for p, t in m.times.items():
            m.iter_times[p] = [t * (1 + 0.02 * math.cos(3 * k)) for k in range(20)]
    stamps = [f"2026-07-09 16:03:{20 + k:02d}" for k in range(len(ms))]
    layout = w.Layout(procs=1, ngpus=8)
    text = w.nccl_text("all_reduce", ms, layout, cputime=True, timestamps=stamps, per_iter=True, per_iter_skip=3)
    (tmp_path / "r.txt").write_text(text)
    r = run_cli("import", "nccl-tests", str(tmp_path / "r.txt"), "--out", str(tmp_path / "run"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "-C 1" in r.stderr and "time_source=cpu" in r.stderr
    df = commbench.load(tmp_path / "run")
    assert set(df["time_source"]) == {"cpu"} and set(df["world_size"]) == {8}
    data = [ln.split() for ln in text.splitlines() if ROW.match(ln)]
    for (_, o), (_, i), toks, ts in zip(placement(df, "out-of-place").iterrows(), placement(df, "in-place").iterrows(),
                                         data, stamps, strict=True):  # fmt: skip
        # columns: 5 fixed, then time algbw busbw #wrong i_min i_max i_p99 i_cv% per placement, then the time stamp
        assert (o["time_us"], o["iter_min_us"], o["iter_max_us"], o["iter_p99_us"]) == tuple(
            map(float, (toks[5], *toks[9:12]))
        )
        assert o["cv"] == pytest.approx(float(toks[12]) / 100)
        assert (i["time_us"], i["iter_min_us"], i["iter_p99_us"]) == (float(toks[13]), float(toks[17]), float(toks[19]))
        assert o["timestamp"] == i["timestamp"] == ts.replace(" ", "T")
    meta = commbench.load_metadata(tmp_path / "run")
    assert meta["start_time"] == stamps[0].replace(" ", "T") and meta["end_time"] == stamps[-1].replace(" ", "T")


def test_run_cycles_stay_one_run(tmp_path: Path) -> None:
    ms = _measures(3)
    again = [w.Measure(m.size, {p: t * 1.01 for p, t in m.times.items()}) for m in ms]
    text = w.nccl_text("all_reduce", ms + again, w.Layout(procs=1, ngpus=8))  # -N 2 prints the sizes twice
    (tmp_path / "r.txt").write_text(text)
    res = import_log(tmp_path / "r.txt", tmp_path / "run")
    df = commbench.load(res.runs[0])
    assert res.runs == [tmp_path / "run"] and sorted(df["cycle"].unique()) == [0, 1]
    second = df[(df["cycle"] == 1) & (df["placement"] == "in-place")].sort_values("size_bytes")
    assert list(second["time_us"]) == [float(w.float_str(m.times["in-place"], 7)) for m in again]


# --- item 5: several runs in one log ---------------------------------------------------------------------------


def test_several_runs_in_one_log_get_one_directory_each(tmp_path: Path) -> None:
    eight = w.nccl_text("all_reduce", _measures(3), w.Layout(procs=1, ngpus=8, hosts=("n1",)))
    sixteen = GCP.read_text()
    gather = w.nccl_text("all_gather", _measures(3), w.Layout(procs=2, ngpus=8, hosts=("node-a", "node-b")))
    (tmp_path / "log.txt").write_text(eight + sixteen + sixteen + gather)
    r = run_cli("import", "nccl-tests", str(tmp_path / "log.txt"), "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    runs = [tmp_path / "out" / f"run{k}" for k in (1, 2, 3)]
    assert [ln.split(" -> ")[1] for ln in r.stdout.splitlines()] == [str(p) for p in runs]
    worlds = [commbench.load_metadata(p)["world_size"] for p in runs]
    assert worlds == [8, 16, 16]  # a new layout, then the same collective again, start a run
    colls = [sorted(commbench.load(p)["collective"].unique()) for p in runs]
    assert colls == [["all_reduce"], ["all_reduce"], ["all_gather", "all_reduce"]]
    assert commbench.load_metadata(runs[2])["nodes"] == 2 and "3 runs" in r.stderr


def test_independent_runs_printed_together_are_refused(tmp_path: Path) -> None:
    src = REAL / "nccl_tests_issue107_two_runs.txt"
    r = run_cli("import", "nccl-tests", str(src), "--out", str(tmp_path / "run"), cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert "lines 8 and 9: rank 0 is listed twice" in r.stderr and not (tmp_path / "run").exists()


# --- item 3: rccl-tests ---------------------------------------------------------------------------------------


def test_rccl_in_place_only_and_fp8_type_names(tmp_path: Path) -> None:
    ms = _measures(4)
    text = w.rccl_text_in_place_only("all_reduce", ms, 8, dtype="fp8_e4m3", width=1)
    (tmp_path / "r.txt").write_text(text)
    res = import_log(tmp_path / "r.txt", tmp_path / "run", collective="all_reduce")
    df = commbench.load(res.runs[0])
    assert set(df["placement"]) == {"in-place"} and len(df) == len(ms)
    assert set(df["precision"]) == {"fp8_e4m3"} and set(df["impl"]) == {"rccl-tests"}
    assert list(df.sort_values("size_bytes")["count"]) == [m.size for m in ms]  # 1 byte per element
    assert set(df["world_size"]) == {8}


def test_rccl_text_from_a_real_run(tmp_path: Path) -> None:
    src = REAL / "hpe_rccl_tests_mi300x_8gpu.txt"
    res = import_log(src, tmp_path / "run")
    df = commbench.load(res.runs[0])
    (toks,) = table_rows(src.read_text())
    assert list(df.sort_values("placement", ascending=False)["busbw_gbps"]) == [float(toks[7]), float(toks[11])]
    assert set(df["impl"]) == {"rccl-tests"} and set(df["world_size"]) == {8} and res.warnings == []
    lo, hi = factor_bounds(toks[7], toks[6])
    assert lo <= ring(8) <= hi and not lo <= ring(7) <= hi and not lo <= ring(9) <= hi
    meta = commbench.load_metadata(res.runs[0])
    assert meta["suite"]["nccl_tests_version"] == "develop:83d38d9" and meta["device_name"] == "AMD Instinct MI300X"


def test_a_file_starting_with_bracket_is_json_only_when_it_is_json(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('[{"version": 3,\n  "results": [}]')
    with pytest.raises(ValueError, match="^line 2: malformed nccl-tests JSON"):
        import_log(bad, tmp_path / "a")
    doc = w.nccl_json("all_reduce", _measures(2), w.Layout(procs=1, ngpus=8), mpi=False)
    (tmp_path / "list.json").write_text("[" + doc + "]")
    assert set(commbench.load(import_log(tmp_path / "list.json", tmp_path / "b").runs[0])["world_size"]) == {8}


def test_rccl_json_lines_from_a_real_run(tmp_path: Path) -> None:
    src = REAL / "rccl_tests_pr93_json_lines.json"
    recs = [json.loads(ln) for ln in src.read_text().splitlines()]
    df = commbench.load(import_log(src, tmp_path / "run").runs[0])
    assert len(df) == len(recs) and set(df["world_size"]) == {4}
    for rec in recs:
        row = df[
            (df["size_bytes"] == rec["size"]) & (df["placement"] == ("in-place" if rec["inPlace"] else "out-of-place"))
        ]
        assert (row["time_us"].item(), row["busbw_gbps"].item()) == (rec["time"], rec["busBw"])
        assert row["busbw_gbps"].item() / row["algbw_gbps"].item() == pytest.approx(ring(4))
    assert set(df["collective"]) == {"all_reduce"} and set(df["count"]) == {256, 512, 1024}


@pytest.mark.parametrize("new_format", [False, True])
@pytest.mark.parametrize("mpi_ranks", [None, 2])
def test_rccl_csv_and_json_files(tmp_path: Path, new_format: bool, mpi_ranks: int | None) -> None:
    ms = _measures(3)
    recs = w.rccl_records(
        "reduce_scatter", ms, 8, dtype="bfloat16", mpi_ranks=mpi_ranks, cycle=0 if new_format else None
    )
    for kind, text in (("csv", w.rccl_csv(recs, new_format=new_format, mpi=bool(mpi_ranks))),
                       ("json", w.rccl_json(recs, new_format=new_format))):  # fmt: skip
        (tmp_path / f"r.{kind}").write_text(text)
        df = commbench.load(import_log(tmp_path / f"r.{kind}", tmp_path / kind).runs[0])
        assert set(df["collective"]) == {"reduce_scatter"} and set(df["world_size"]) == {8}
        assert set(df["precision"]) == {"bf16"}
        # reduce_scatter's count is one rank's share: size / (8 x 2 bytes)
        assert (df["count"] == df["size_bytes"] // 16).all()
        for m in ms:
            row = df[(df["size_bytes"] == m.size) & (df["placement"] == "in-place")]
            alg, bus = w.bandwidths("reduce_scatter", m.size, m.times["in-place"], 8)
            assert row["busbw_gbps"].item() == float(f"{bus:f}") and row["time_us"].item() == m.times["in-place"]
