"""The trace reader and the replay's pure parts: the committed NCCL-format fixture (written to torch's
``record_param_comms`` fields, ``torch/csrc/profiler/util.h``), gloo's shapes-only records, the execution trace,
refusals (one line, exit 2), group layouts and the exposure (HolisticTraceAnalysis' definitions)."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path
from typing import Any

import pytest

from commbench.cli import main
from commbench.store.trace_calls import TraceError
from commbench.store.trace_exposure import exposure, intersection, merge
from commbench.store.traces import load_traces, pick_step, read_trace, step_calls, step_rows, trace_groups

FIXTURE = Path(__file__).parent / "data" / "traces" / "nccl_tp_dp_rank0.json"


def _doc(events: list[dict[str, Any]], **info: Any) -> dict[str, Any]:
    return {"schemaVersion": 1, "distributedInfo": {"backend": "gloo", "rank": 0, "world_size": 2, **info}, "traceEvents": events}


def _x(name: str, ts: float, dur: float, tid: int = 1, **args: Any) -> dict[str, Any]:
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": args}


def _write(tmp_path: Path, doc: Any, name: str = "t.json") -> Path:
    p = tmp_path / name
    p.write_text(json.dumps(doc))
    return p


def test_nccl_fixture_calls_per_step() -> None:
    """The fixture's step: all_gather of 1024 -> 2048 bf16 elements on the TP group, two all_reduces of 4096 bf16,
    a reduce_scatter of 8192 -> 4096 float on the DP group, one send of 1024 floats; nccl-tests' sizes: all_gather
    the output, the others the input."""
    t = read_trace(FIXTURE)
    assert (t.backend, t.rank, t.world_size, t.steps) == ("nccl", 0, 4, [5, 6])
    rows = [(r.collective, r.size_bytes, r.dtype, r.group, r.calls_per_step) for r in step_rows(step_calls(t, 6))]
    assert rows == [
        ("all_gather", 2048 * 2, "bfloat16", (0, 1), 1),
        ("all_reduce", 4096 * 2, "bfloat16", (0, 1), 2),
        ("reduce_scatter", 8192 * 4, "float32", (0, 2), 1),
        ("send", 1024 * 4, "float32", (0, 2), 1),
    ]
    send = next(c for c in step_calls(t, 6) if c.collective == "send")
    assert send.peer == 2
    # unknown names are counted and named, one per step; barriers are no call; c10d operators around a
    # record_param_comms are the same call, not a second one
    assert t.unread == {"record_param_comms: unknown collective 'allreduce_sparse'": 2}
    assert t.skipped["record_param_comms (barrier: no payload)"] == 2
    assert t.skipped["c10d::allreduce_ (read from the record_param_comms inside it)"] == 6


def test_steps_are_picked() -> None:
    t = read_trace(FIXTURE)
    assert pick_step(t, "last") == 6 and pick_step(t, "first") == 5 and pick_step(t, "5") == 5
    for bad in ("7", "all", "middle"):
        with pytest.raises(TraceError):
            pick_step(t, bad)


def test_gzip_reads_the_same(tmp_path: Path) -> None:
    gz = tmp_path / "rank0.pt.trace.json.gz"
    gz.write_bytes(gzip.compress(FIXTURE.read_bytes()))
    assert step_calls(read_trace(gz), 6) == step_calls(read_trace(FIXTURE), 6)


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (lambda raw: raw[: len(raw) // 2], "truncated or not JSON"),
        (lambda raw: gzip.compress(raw)[:200], "truncated or damaged gzip"),
        (lambda raw: b'{"foo": 1}', "unknown format"),
        (lambda raw: b"[1, 2]", "unknown format"),
        (lambda raw: raw.replace(b'"schemaVersion": 1', b'"schemaVersion": 7'), "schemaVersion 7"),
        (lambda raw: json.dumps(_doc([_x("aten::mm", 0, 5)])).encode(), "no communication call"),
    ],
)
def test_bad_traces_are_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], content: Any, words: str) -> None:
    p = tmp_path / "bad.json"
    p.write_bytes(content(FIXTURE.read_bytes()))
    with pytest.raises(TraceError, match=words):
        load_traces([p])
    assert main(["replay", str(p)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0]


def test_step_window(tmp_path: Path) -> None:
    """--step A:B: the calls between A and B us after the first call, as one step, in time order."""
    ev = [_x("c10d::_allgather_base_", t, 5, **{"Input Dims": [[2 * n], [n]], "Input type": ["float", "float"]})
          for t, n in ((100, 4), (150, 8), (400, 16))]  # fmt: skip
    t = read_trace(_write(tmp_path, _doc(ev)))
    s = pick_step(t, "40:310")  # all_gather's size is its output: 2n elements
    assert [(c.numel, c.order) for c in step_calls(t, s)] == [(16, 0), (32, 1)]
    t = read_trace(_write(tmp_path, _doc(ev)))
    assert [c.numel for c in step_calls(t, pick_step(t, "0:50"))] == [8, 16]
    for bad in ("5:1", "a:b", "1000:2000"):
        with pytest.raises(TraceError):
            pick_step(read_trace(_write(tmp_path, _doc(ev))), bad)


def test_trace_without_steps_needs_step_all(tmp_path: Path) -> None:
    ev = [_x("c10d::allreduce_", 10, 5, **{"Input Dims": [[[8]]], "Input type": ["TensorList"]}),
          {"ph": "X", "cat": "user_annotation", "name": "gloo:all_reduce", "pid": 1, "tid": 2, "ts": 11, "dur": 2,
           "args": {"Input Dims": [[8]], "Input type": ["float"]}}]  # fmt: skip
    t = read_trace(_write(tmp_path, _doc(ev)))
    with pytest.raises(TraceError, match="--step all"):
        pick_step(t, "last")
    assert pick_step(t, "all") == -1
    (c,) = step_calls(t, -1)
    # Kineto writes a list argument's type as TensorList: the dtype is the gloo work item's
    assert (c.collective, c.numel, c.dtype, c.group) == ("all_reduce", 8, "float32", (0, 1))


def test_gloo_records_without_dtype_or_shapes_are_named(tmp_path: Path) -> None:
    ev = [_x("ProfilerStep#3", 0, 100),
          _x("c10d::allreduce_", 10, 5, **{"Input Dims": [[[8]]], "Input type": ["TensorList"]}),
          _x("c10d::_allgather_base_", 20, 5),
          _x("_c10d_functional::all_gather_into_tensor", 30, 5,
             **{"Input Dims": [[4], [], []], "Input type": ["c10::BFloat16", "Scalar", "String"],
                "Concrete Inputs": ["", "2", "0"]})]  # fmt: skip
    t = read_trace(_write(tmp_path, _doc(ev)))
    assert t.unread == {
        "c10d::allreduce_: dtype not recorded": 1,
        "c10d::_allgather_base_: no input shapes (profile with record_shapes=True)": 1,
    }
    (c,) = step_calls(t, 3)
    assert (c.collective, c.in_numel, c.out_numel, c.dtype, c.size_bytes) == ("all_gather", 4, 8, "bfloat16", 16)


def test_ambiguous_group_is_unread(tmp_path: Path) -> None:
    """gloo's c10d records do not name their group: with two layouts of equal size the trace cannot tell."""
    groups = [{"pg_name": "1", "pg_desc": "tp", "ranks": [0, 1]}, {"pg_name": "2", "pg_desc": "dp", "ranks": [0, 2]}]
    ev = [_x("ProfilerStep#0", 0, 100),
          _x("c10d::_reduce_scatter_base_", 10, 5, **{"Input Dims": [[4], [8]], "Input type": ["float", "float"]})]  # fmt: skip
    t = read_trace(_write(tmp_path, _doc(ev, world_size=4, pg_config=groups)))
    assert list(t.unread) == ["c10d::_reduce_scatter_base_: process group not recorded (2 groups hold rank 0)"]


def test_group_layouts() -> None:
    """A TP group [0, 1] of four ranks is one of [[0, 1], [2, 3]]; a DP group [0, 2] one of [[0, 2], [1, 3]]; on
    another world size only whole-world groups map."""
    ts = [read_trace(FIXTURE)]
    calls = step_calls(ts[0], 6)
    layouts = trace_groups(ts, calls, 4)
    assert layouts == [[[0, 1], [2, 3]], [[0, 1], [2, 3]], [[0, 1], [2, 3]], [[0, 2], [1, 3]], [[0, 2], [1, 3]]]
    with pytest.raises(TraceError, match="only whole-world groups map onto 2 ranks"):
        trace_groups(ts, calls, 2)


def test_exposure_follows_hta() -> None:
    """Step 6 of the fixture: seven 100 us NCCL kernels; one gemm overlaps the first by 50 us, an elementwise
    kernel overlaps none. HTA: overlap = time both run / communication time."""
    e = exposure(read_trace(FIXTURE), 6)
    assert e is not None
    assert (e.comm_us, e.overlap_us, e.exposed_us) == (700.0, 50.0, 650.0)
    assert e.overlap_ratio == pytest.approx(50 / 700)
    assert e.step_us == 1990.0  # the GPU timeline's ProfilerStep annotation
    assert e.projected_step_us(2.0) == pytest.approx(1990 - 650 + 325)
    assert merge([(0, 2), (1, 3), (5, 6)]) == [(0, 3), (5, 6)]
    assert intersection([(0, 3), (5, 6)], [(2, 5.5)]) == 1.5


def test_cpu_trace_has_no_exposure(tmp_path: Path) -> None:
    ev = [_x("ProfilerStep#0", 0, 100), _x("c10d::_allgather_base_", 10, 5, **{"Input Dims": [[4], [2]], "Input type": ["float", "float"]})]
    assert exposure(read_trace(_write(tmp_path, _doc(ev))), 0) is None


def test_unknown_precision_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", str(FIXTURE), "--precisions", "trace,bf17"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "bf17" in err[0] and "bf16" in err[0]


def test_dry_run_prints_the_step(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", str(FIXTURE), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "reduce_scatter" in out and "32768 B" in out and "unknown collective 'allreduce_sparse'" in out


DDP_FIXTURE = Path(__file__).parent / "data" / "traces" / "nccl_ddp_rank0.json"


@pytest.mark.timeout(300)
def test_replay_command_end_to_end(tmp_path: Path) -> None:
    """`commbench replay` on a 2-rank NCCL trace, spawned locally on gloo: replay.csv has one row per (call size,
    precision) with the trace's calls per step; replay_steps.csv the step's bytes per precision (formula: elements x
    element size) and the trace's exposure (fixture: three 80 us NCCL kernels, a gemm hiding the first; a Memcpy is
    no computation in HTA's terms)."""
    import csv

    from tests.cli_util import commbench

    out = tmp_path / "rep"
    r = commbench("replay", str(DDP_FIXTURE), "--out", str(out), "--precisions", "trace,bf16", "--max-time", "0.2",
                  "--repeats", "2", "--min-time", "0.0005", cwd=Path(__file__).parent.parent, timeout=280)  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    rows = list(csv.DictReader(open(out / "replay.csv")))
    got = {(x["collective"], int(x["size_bytes"]), x["dtype"], x["precision"]): (int(x["calls_per_step"]), int(x["wire_bytes"])) for x in rows}
    assert got == {
        ("all_reduce", 2048, "bfloat16", "bf16"): (2, 2048),
        ("all_gather", 4096, "float32", "fp32"): (1, 4096),
        ("all_gather", 4096, "float32", "bf16"): (1, 2048),
    }
    for x in rows:
        assert float(x["time_ci_low_us"]) <= float(x["time_us"]) <= float(x["time_ci_high_us"])
    calls = [(x["order"], x["collective"], x["size_bytes"], x["group"], x["placement"]) for x in csv.DictReader(open(out / "replay_calls.csv"))]
    # one rank's trace: where its peers ran is unknown
    assert calls == [("0", "all_reduce", "2048", "0 1", "unknown"), ("1", "all_reduce", "2048", "0 1", "unknown"),
                     ("2", "all_gather", "4096", "0 1", "unknown")]  # fmt: skip
    steps = {x["precision"]: x for x in csv.DictReader(open(out / "replay_steps.csv"))}
    assert int(steps["trace"]["bytes_per_step"]) == 2 * 2048 + 4096
    assert int(steps["bf16"]["bytes_per_step"]) == 2 * 2048 + 2048
    assert float(steps["trace"]["trace_comm_us"]) == 240.0 and float(steps["trace"]["exposed_us"]) == 160.0
    assert float(steps["trace"]["projected_step_us"]) == 990.0
    assert "exposure (HolisticTraceAnalysis' definition)" in r.stdout and "all_reduce" in r.stdout
    report = (out / "replay.md").read_text()
    assert report.index("### Findings") < report.index("### The step per precision") < report.index("### Per call size")
    assert "**bf16**" in report and "160 us were exposed" in report
    # the replay folder is a run directory too: `fit` (and so `plan RUN_DIR`) reads the job's own call sizes
    fit = commbench("fit", str(out), "--out", str(tmp_path / "model.json"), cwd=Path(__file__).parent.parent, timeout=120)
    assert fit.returncode == 0, fit.stderr[-2000:]
    model = json.loads((tmp_path / "model.json").read_text())
    # one size per collective here (a real step has many): the fit reads every row and says it needs more sizes
    assert set(model["skipped"]) == {"all_reduce/bf16/world", "all_gather/fp32/world", "all_gather/bf16/world"}
    again = commbench("replay", str(DDP_FIXTURE), "--out", str(out), cwd=Path(__file__).parent.parent, timeout=60)
    assert again.returncode == 2 and "not empty" in again.stderr  # nothing already written is lost


def test_nested_records_are_one_call(tmp_path: Path) -> None:
    """A record_param_comms inside another (one collective built from others) and a c10d operator inside a
    functional collective are parts of the outer call, counted as no call of their own."""
    rpc = {"Collective name": "allreduce", "dtype": "Float", "In msg nelems": 16, "Out msg nelems": 16,
           "Process Group Name": "0", "Process Group Ranks": "[0, 1]", "Group size": 2}  # fmt: skip
    ev = [_x("ProfilerStep#1", 0, 100),
          _x("c10d::allreduce_", 10, 20), _x("record_param_comms", 11, 15, **rpc), _x("record_param_comms", 12, 5, **rpc),
          _x("_c10d_functional::all_reduce", 40, 20, **{"Input Dims": [[8], [], []], "Input type": ["float", "", ""],
                                                        "Concrete Inputs": ["", "sum", "0"]}),
          _x("c10d::allreduce_", 41, 5, **{"Input Dims": [[[8]]], "Input type": ["TensorList"]})]  # fmt: skip
    t = read_trace(_write(tmp_path, _doc(ev, pg_config=[{"pg_name": "0", "pg_desc": "default_pg", "ranks": [0, 1]}])))
    assert [(c.source, c.numel) for c in step_calls(t, 1)] == [("record_param_comms", 16), ("_c10d_functional::all_reduce", 8)]
    assert not t.unread
    assert t.skipped["c10d::allreduce_ (read from the record_param_comms inside it)"] == 1
    assert t.skipped["c10d::allreduce_ (inside another communication record: the same call)"] == 1
    assert t.skipped["record_param_comms (inside another communication record: the same call)"] == 1



def test_an_operator_inside_itself_is_read_from_the_inner(tmp_path: Path) -> None:
    """A tensor subclass's collective dispatches twice (torchao's Float8TrainingTensor: the functional all-gather with
    its nominal fp32 type, then inside it with its uint8 codes): one call, of what the backend got; on NCCL the
    record_param_comms inside both is the call, still once."""
    ag = "_c10d_functional::all_gather_into_tensor"

    def shaped(t: str) -> dict[str, Any]:
        return {"Input Dims": [[4, 32], [], []], "Input type": [t, "Scalar", ""], "Concrete Inputs": ["", "2", "0"]}

    rpc = {"Collective name": "_allgather_base", "dtype": "Byte", "In msg nelems": 128, "Out msg nelems": 256,
           "Process Group Name": "0", "Process Group Ranks": "[0, 1]", "Group size": 2}  # fmt: skip
    ev = [_x("ProfilerStep#1", 0, 100), _x(ag, 10, 20, **shaped("float")), _x(ag, 11, 15, **shaped("unsigned char")),
          _x(ag, 40, 20, **shaped("float")), _x(ag, 41, 15, **shaped("unsigned char")),
          _x("c10d::_allgather_base_", 42, 10), _x("record_param_comms", 43, 5, **rpc)]  # fmt: skip
    t = read_trace(_write(tmp_path, _doc(ev, pg_config=[{"pg_name": "0", "pg_desc": "default_pg", "ranks": [0, 1]}])))
    calls = step_calls(t, 1)
    assert [(c.source, c.dtype, c.size_bytes) for c in calls] == [(ag, "uint8", 256), ("record_param_comms", "uint8", 256)]
    assert t.skipped[f"{ag} (inside another communication record: the same call)"] == 2 and not t.unread

def _et(nodes: list[dict[str, Any]], schema: str = "1.1.1-chakra.0.0.4") -> dict[str, Any]:
    return {"schema": schema, "pid": 1, "time": "2026-12-03 07:31:35", "start_ts": 0, "nodes": nodes, "finish_ts": 1}


def _node(nid: int, name: str, parent: int, shapes: list[Any] | None = None, types: list[Any] | None = None,
          values: list[Any] | None = None) -> dict[str, Any]:  # fmt: skip
    return {"id": nid, "name": name, "ctrl_deps": parent, "inputs": {"values": values or [], "shapes": shapes or [], "types": types or []}}


def test_execution_trace(tmp_path: Path) -> None:
    """The execution trace as ExecutionTraceObserver writes it (torch 2.13): list types name their dtype, the step
    is the ProfilerStep node above a call, a gloo work item under its c10d operator is the same call, no group is
    recorded."""
    nodes = [
        _node(1, "[pytorch|profiler|execution_trace|process]", 1),
        _node(4, "ProfilerStep#7", 1),
        _node(10, "c10d::allreduce_", 4, [[[1000]], [], []], ["GenericList[Tensor(c10::BFloat16)]", "Object", "Object"]),
        _node(11, "gloo:all_reduce", 10, [[1000]], ["Tensor(c10::BFloat16)"]),
        _node(20, "c10d::send", 4, [[[10]], [], [], []], ["GenericList[Tensor(float)]", "Object", "Int", "Int"], [[[1]], "<Object>", 1, 0]),
        _node(30, "c10d::allreduce_", 1, [[[4]]], ["GenericList[Tensor(float)]"]),
    ]
    t = read_trace(_write(tmp_path, _et(nodes)))
    assert (t.format, t.steps) == ("execution_trace", [7])
    got = [(c.collective, c.numel, c.dtype, c.group, c.peer, c.order) for c in step_calls(t, 7)]
    assert got == [("all_reduce", 1000, "bfloat16", None, None, 0), ("send", 10, "float32", None, 1, 1)]
    assert t.skipped == {"gloo:all_reduce (inside another communication record: the same call)": 1,
                         "c10d::allreduce_ (outside every ProfilerStep span)": 1}  # fmt: skip
    with pytest.raises(TraceError, match="execution-trace schema '2.0.0'"):
        read_trace(_write(tmp_path, _et(nodes, "2.0.0"), "et2.json"))


def test_gpu_replay_check_refuses_without_cuda() -> None:
    """The GPU check of the reader on a real NCCL trace (benchmarks/gpu_replay_check.py) must not pass on a machine
    without CUDA: one line, exit 2."""
    import subprocess
    import sys

    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA machine runs the check itself")
    script = Path(__file__).parent.parent / "benchmarks" / "gpu_replay_check.py"
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "no CUDA" in r.stderr


HTA_TRACE = Path(__file__).parent / "data" / "traces" / "hta_resnet_nccl_rank0.json.gz"


def test_real_nccl_trace() -> None:
    """A real NCCL trace (HolisticTraceAnalysis' test data, see tests/data/traces/README.md): per step, one call per
    c10d operator; over the three steps, the calls are the NCCL kernels, whose metadata Kineto writes from the same
    call a second time (HTA's own test counts 21 NCCL kernels, the largest all_reduce of 2049000 elements)."""
    raw = json.loads(gzip.decompress(HTA_TRACE.read_bytes()))
    ev = [e for e in raw["traceEvents"] if e.get("ph") == "X"]
    t = read_trace(HTA_TRACE)
    assert (t.backend, t.world_size, t.steps) == ("nccl", 2, [4, 5, 6])
    assert not t.unread
    for s in t.steps:
        lo, hi = t.step_spans[s]
        ops = [e["name"] for e in sorted(ev, key=lambda e: e["ts"]) if e["name"].startswith("c10d::") and lo <= e["ts"] <= hi]
        calls = step_calls(t, s)
        assert len(calls) == len(ops) == 7
        assert [c.collective for c in calls] == [o.removeprefix("c10d::").rstrip("_").replace("allreduce", "all_reduce") for o in ops]
    names = {"allreduce": "all_reduce", "broadcast": "broadcast"}
    kernels = sorted((names[e["args"]["Collective name"]], e["args"]["In msg nelems"]) for e in ev if e.get("cat") == "kernel")
    assert len(kernels) == 21
    assert sorted((c.collective, c.numel) for c in t.calls) == kernels
    assert ("all_reduce", 2049000) in kernels and all(c.dtype in ("float32", "int64") for c in t.calls)


def test_older_torch_trace() -> None:
    """A real trace of an older torch (HTA's sampled_rank-0, see tests/data/traces/README.md): its record_param_comms
    carry no fields and its c10d::allreduce_ records no shapes, so each all_reduce is sized by the nccl:all_reduce
    record inside it; its all_gathers ran on a 64-rank group the trace does not list, and are named as unread."""
    path = Path(__file__).parent / "data" / "traces" / "hta_sampled_torch20_rank0.json.gz"
    raw = json.loads(gzip.decompress(path.read_bytes()))
    ev = sorted((e for e in raw["traceEvents"] if e.get("ph") == "X"), key=lambda e: e["ts"])
    t = read_trace(path)
    inner = [
        math.prod(_flat(w["args"]["Input Dims"]))
        for o in ev if o["name"] == "c10d::allreduce_"
        for w in ev if w["name"] == "nccl:all_reduce" and o["ts"] <= w["ts"] <= o["ts"] + o["dur"]
    ]  # fmt: skip
    got = [c.numel for c in sorted(t.calls, key=lambda c: c.ts_us) if c.collective == "all_reduce"]
    assert got == inner and len(got) == 4 and all(c.dtype == "float32" for c in t.calls if c.collective == "all_reduce")
    a2a = [(math.prod(o["args"]["Input Dims"][1])) for o in ev if o["name"] == "c10d::alltoall_base_"]
    assert [c.numel for c in sorted(t.calls, key=lambda c: c.ts_us) if c.collective == "all_to_all"] == a2a
    assert t.unread == {"c10d::_allgather_base_: process group not recorded: a 64-rank group, and the trace lists none holding rank 0": 2}
    assert all(c.group == tuple(range(128)) for c in t.calls)


def _flat(dims: Any) -> list[int]:
    """The shape inside a Kineto dims entry (``[[[n]]]`` for a one-tensor list)."""
    while dims and isinstance(dims[0], list):
        dims = dims[0]
    return list(dims)


def test_kineto_and_execution_trace_of_one_run(tmp_path: Path) -> None:
    """A folder with a rank's Kineto trace and its execution trace: the Kineto one (which knows the groups) leads."""
    (tmp_path / "rank0.json").write_bytes(FIXTURE.read_bytes())
    nodes = [_node(4, "ProfilerStep#6", 1), _node(10, "c10d::allreduce_", 4, [[[8]]], ["GenericList[Tensor(float)]"])]
    _write(tmp_path, _et(nodes), "rank0_et.json")
    ts = load_traces([tmp_path])
    assert [t.format for t in ts] == ["kineto", "execution_trace"]
