"""Pure checks: nccl-tests definitions, size strings, suite validation, launch environment parsing,
statistics and crossover — against formulas and hand-computed values, not against commbench's own output."""

from __future__ import annotations

import statistics

import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from commbench.cluster.launch import detect_world, first_slurm_host, slurm_local_tasks, slurm_tasks_per_node
from commbench.core.suite import load_suite, suite_from_dict
from commbench.core.units import format_size, parse_size, size_grid
from commbench.measure.collectives import COLLECTIVES, get_collective
from commbench.measure.precision import get_precision
from commbench.measure.timing import Stats, bandwidth_gbps, percentile
from commbench.store.results import crossover


# nccl-tests doc/PERFORMANCE.md: AllReduce busbw = algbw * 2(n-1)/n; ReduceScatter, AllGather, AlltoAll (n-1)/n.
@pytest.mark.parametrize("n", [2, 3, 8])
def test_bus_factors_match_nccl_tests(n: int) -> None:
    assert get_collective("all_reduce").bus_factor(n) == pytest.approx(2 * (n - 1) / n)
    for name in ("all_gather", "reduce_scatter", "all_to_all"):
        assert get_collective(name).bus_factor(n) == pytest.approx((n - 1) / n)


@pytest.mark.parametrize("n", [2, 3, 8])
def test_size_definitions(n: int) -> None:
    total = 1024 * n
    ar = get_collective("all_reduce").layout(total, n)
    assert (ar.input_numel, ar.output_numel, ar.count) == (total, total, total)
    ag = get_collective("all_gather").layout(total, n)  # size = total output; count = per-rank send count
    assert (ag.input_numel, ag.output_numel, ag.count) == (total // n, total, total // n)
    rs = get_collective("reduce_scatter").layout(total, n)  # size = total input; count = per-rank recv count
    assert (rs.input_numel, rs.output_numel, rs.count) == (total, total // n, total // n)
    a2a = get_collective("all_to_all").layout(total, n)
    assert (a2a.input_numel, a2a.output_numel, a2a.count) == (total, total, total // n)


def test_round_total_like_nccl_tests() -> None:
    # nccl-tests: per-rank count = (count/nranks) & -(16/eltSize); fp32 -> multiples of 4 elements per rank
    assert get_collective("all_gather").round_total(256, 3) == 3 * 84
    # 6 ranks, fp32, 1 MiB all_gather: nccl-tests prints 1048512 B (262144/6 = 43690 -> 43688 per rank)
    for name in ("all_gather", "reduce_scatter", "all_to_all"):
        assert get_collective(name).round_total(1024**2 // 4, 6) * 4 == 1048512
    assert get_collective("all_reduce").round_total(257, 3) == 257


def test_references_against_hand_values() -> None:
    import torch

    a = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64)
    b = torch.tensor([10.0, 20.0, 30.0, 40.0], dtype=torch.float64)
    assert get_collective("all_reduce").reference([a, b], 1).tolist() == [11, 22, 33, 44]
    assert get_collective("reduce_scatter").reference([a, b], 1).tolist() == [33, 44]
    assert get_collective("all_gather").reference([a[:2], b[:2]], 0).tolist() == [1, 2, 10, 20]
    assert get_collective("all_to_all").reference([a, b], 0).tolist() == [1, 2, 10, 20]
    assert get_collective("all_to_all").reference([a, b], 1).tolist() == [3, 4, 30, 40]


@given(st.integers(min_value=1, max_value=2**20), st.sampled_from(["", "K", "M", "G"]))
def test_parse_size_roundtrip(value: int, unit: str) -> None:
    mult = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3}[unit]
    assert parse_size(f"{value}{unit}") == value * mult
    assert parse_size(format_size(value * mult)) == value * mult


@given(st.text(max_size=8).filter(lambda s: not s.strip().isdigit()))
def test_parse_size_rejects_garbage_with_valueerror(text: str) -> None:
    try:
        v = parse_size(text)
    except ValueError as e:
        assert "size" in str(e)
    else:  # only well-formed strings like "3k" or "2 M" may pass
        assert v > 0 and text.strip()[-1].upper() in "KMGB"


@pytest.mark.parametrize("bad", ["1XB", "-4K", "0", "", "K", "1.5M", "4T"])
def test_parse_size_malformed(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_size(bad)


def test_size_grid_like_nccl_tests() -> None:
    assert size_grid(8, 128, 2) == [8, 16, 32, 64, 128]
    assert size_grid(1024, 16 * 1024**2, 4)[-1] == 16 * 1024**2
    with pytest.raises(ValueError, match="larger than maximum"):
        size_grid(2048, 1024)


def test_suite_validation_messages() -> None:
    with pytest.raises(ValueError, match="unknown collective 'all_reduse'.*all_reduce"):
        suite_from_dict({"collectives": ["all_reduse"]})
    with pytest.raises(ValueError, match="unknown precision 'fp64'.*fp32"):
        suite_from_dict({"precisions": ["fp64"]})
    with pytest.raises(ValueError, match="unknown suite key"):
        suite_from_dict({"colectives": ["all_reduce"]})
    with pytest.raises(ValueError, match="malformed size"):
        suite_from_dict({"min_bytes": "1XB"})
    with pytest.raises(ValueError, match="timing.repeats"):
        suite_from_dict({"timing": {"repeats": 0}})
    with pytest.raises(ValueError, match="unknown payload"):
        suite_from_dict({"payload": "uniform"})


def test_quick_suite_loads_and_covers_the_issue_grid() -> None:
    s = load_suite("quick")
    assert {"all_reduce", "all_gather", "reduce_scatter"} <= set(s.collectives)
    assert s.min_bytes <= 4096 and s.max_bytes >= 16 * 1024**2
    for p in s.precisions:
        get_precision(p)


def test_every_builtin_collective_is_registered() -> None:
    # test files may register toy collectives of their own (tests/test_codec_extension.py)
    builtin = {name for name, c in COLLECTIVES.items() if type(c).__module__ == "commbench.measure.collectives"}
    assert builtin == {"all_reduce", "all_gather", "reduce_scatter", "all_to_all"}


def test_slurm_nodelist() -> None:
    assert first_slurm_host("node[01-04,07]") == "node01"
    assert first_slurm_host("gpu17") == "gpu17"
    assert first_slurm_host("a-b[3,5-6],c1") == "a-b3"


def test_detect_world_variants() -> None:
    assert detect_world({}) is None
    w = detect_world({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "4", "MASTER_ADDR": "h0", "MASTER_PORT": "1234"})
    assert w is not None and (w.rank, w.world_size, w.local_rank, w.master_addr, w.master_port, w.launcher) == (3, 8, 3, "h0", 1234, "torchrun")
    s = detect_world({"SLURM_PROCID": "5", "SLURM_NTASKS": "16", "SLURM_LOCALID": "1", "SLURM_JOB_NODELIST": "n[10-13]", "SLURM_NTASKS_PER_NODE": "4(x4)", "SLURM_JOB_ID": "77"})
    assert s is not None and (s.rank, s.world_size, s.local_rank, s.local_world_size, s.master_addr, s.launcher) == (5, 16, 1, 4, "n10", "slurm")
    assert detect_world({"SLURM_PROCID": "0", "SLURM_NTASKS": "1"}) is None  # a single-task allocation spawns locally
    # `srun -n 7 -N 2`: 4 tasks on node 0, 3 on node 1 (Slurm's compressed list); each node its own count
    uneven = {"SLURM_NTASKS": "7", "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_STEP_TASKS_PER_NODE": "4,3"}
    for procid, node, local in (("2", "0", 4), ("5", "1", 3)):
        u = detect_world({**uneven, "SLURM_PROCID": procid, "SLURM_NODEID": node})
        assert u is not None and u.local_world_size == local
    spec = {"SLURM_STEP_TASKS_PER_NODE": "2(x3),1"}
    assert [slurm_local_tasks({**spec, "SLURM_NODEID": str(i)}) for i in range(4)] == [2, 2, 2, 1]
    assert slurm_tasks_per_node("2(x3),1") == [2, 2, 2, 1] and slurm_tasks_per_node("x") == []
    m = detect_world({"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "MASTER_ADDR": "h1"})
    assert m is not None and (m.rank, m.world_size, m.local_world_size, m.launcher) == (2, 4, 2, "mpi")
    with pytest.raises(ValueError, match="MASTER_ADDR"):
        detect_world({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2"})


def test_stats_against_hand_values() -> None:
    # rank 0 samples 1,2,3 us (median 2), rank 1 samples 4,5,6 us (median 5)
    s = Stats.from_ranks([[1e-6, 2e-6, 3e-6], [4e-6, 5e-6, 6e-6]])
    assert s.time_us == pytest.approx(3.5)  # mean of rank medians, nccl-tests' convention
    assert s.time_us_max == pytest.approx(5.0)
    assert s.p50_us == pytest.approx(3.5)
    assert s.p95_us == pytest.approx(5.75)  # numpy.percentile([1..6], 95, method="linear")
    assert s.cv == pytest.approx(statistics.pstdev([1, 2, 3, 4, 5, 6]) / 3.5)
    assert s.rank_spread == pytest.approx(1.5)
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert bandwidth_gbps(1e9, 1e6) == pytest.approx(1.0)  # 1e9 B in 1 s = 1 GB/s


def test_crossover_rule() -> None:
    rows = []
    for size, base, fast in [(1, 1.0, 0.5), (2, 1.0, 1.5), (4, 1.0, 0.9), (8, 1.0, 2.0), (16, 1.0, 3.0)]:
        rows.append({"collective": "all_reduce", "payload": "normal", "precision": "fp32", "fp32_bytes": size, "effective_gbps": base})
        rows.append({"collective": "all_reduce", "payload": "normal", "precision": "bf16", "fp32_bytes": size, "effective_gbps": fast})
        rows.append({"collective": "all_reduce", "payload": "normal", "precision": "fp16", "fp32_bytes": size, "effective_gbps": 0.1})
    out = {r["precision"]: r for r in crossover(pd.DataFrame(rows))}
    assert out["bf16"]["crossover_bytes"] == 8  # wins at 2 but loses again at 4: the crossover is where it stays ahead
    assert out["fp16"]["crossover_bytes"] is None and out["fp16"]["note"] == "never in range"


def test_crossover_needs_a_significant_gain_at_every_larger_size() -> None:
    # (size, gain, 95 % interval) per precision; a size is a win only when the interval lies above 1
    table = {
        "bf16": [(1, 1.5, 1.2, 1.8), (2, 1.3, 0.9, 1.6), (4, 1.4, 1.1, 1.6), (8, 1.5, 1.2, 1.9)],
        "fp16": [(1, 1.1, 0.8, 1.3), (2, 1.2, 0.9, 1.4), (4, 1.0, 0.8, 1.2), (8, 1.1, 0.95, 1.3)],
        "fp8": [(1, 0.5, 0.4, 0.6), (2, 1.2, 1.1, 1.3), (4, 0.9, 0.8, 1.1), (8, 0.7, 0.6, 0.8)],
    }
    rows = []
    for prec, pts in table.items():
        for size, g, lo, hi in pts:
            for p, gg, ll, hh in (("fp32", 1.0, 1.0, 1.0), (prec, g, lo, hi)):
                rows.append({"collective": "all_reduce", "payload": "normal", "precision": p, "fp32_bytes": size,
                             "effective_gbps": gg, "gain_vs_fp32": gg, "gain_ci_low": ll, "gain_ci_high": hh})  # fmt: skip
    out = {r["precision"]: r for r in crossover(pd.DataFrame(rows).drop_duplicates(["precision", "fp32_bytes"]))}
    assert out["bf16"]["crossover_bytes"] == 4 and out["bf16"]["note"] == ""
    assert out["fp16"]["crossover_bytes"] is None and out["fp16"]["note"] == "not significant"
    assert out["fp8"]["crossover_bytes"] is None and out["fp8"]["note"] == "never in range"
    assert (out["bf16"]["gain_at_largest"], out["bf16"]["gain_at_largest_ci_low"]) == (1.5, 1.2)
    # bf16 wins from 4 but 2 is no significant loss: the crossover lies somewhere below 4, not located
    assert out["bf16"]["crossover_low_bytes"] is None and out["bf16"]["significant"] is False


def _gain_rows(table: dict[str, list[tuple[int, float, float]]]) -> pd.DataFrame:
    rows = []
    for prec, pts in table.items():
        for size, lo, hi in pts:
            g = (lo + hi) / 2
            for p, gg, ll, hh in (("fp32", 1.0, 1.0, 1.0), (prec, g, lo, hi)):
                rows.append({"collective": "all_reduce", "payload": "normal", "precision": p, "fp32_bytes": size,
                             "effective_gbps": gg, "gain_vs_fp32": gg, "gain_ci_low": ll, "gain_ci_high": hh})  # fmt: skip
    return pd.DataFrame(rows).drop_duplicates(["precision", "fp32_bytes"])


def test_crossover_is_located_only_between_a_significant_loss_and_a_significant_win() -> None:
    # (size, 95 % interval of the speed-up over fp32)
    table = {
        "bf16": [(1, 0.5, 0.7), (2, 0.6, 0.9), (4, 1.1, 1.3), (8, 1.2, 1.5)],  # loss at 2, win from 4: located at 4
        "fp16": [(1, 0.5, 0.7), (2, 0.9, 1.1), (4, 1.1, 1.3), (8, 1.2, 1.5)],  # loss at 1, tie at 2: between 1 and 4
        "fp8": [(1, 1.1, 1.3), (2, 1.2, 1.4), (4, 1.1, 1.3), (8, 1.2, 1.5)],  # wins everywhere: from the smallest
        "e5m2": [(1, 1.1, 1.3), (2, 0.9, 1.1), (4, 1.1, 1.3), (8, 1.2, 1.5)],  # tie at 2 after a win at 1
    }
    out = {r["precision"]: r for r in crossover(_gain_rows(table))}
    got = {p: (r["crossover_bytes"], r["crossover_low_bytes"], r["significant"]) for p, r in out.items()}
    assert got == {"bf16": (4, 2, True), "fp16": (4, 1, False), "fp8": (1, None, True), "e5m2": (4, None, False)}


def test_every_shipped_suite_is_valid() -> None:
    from pathlib import Path

    suites = sorted((Path(__file__).resolve().parent.parent / "suites").glob("*.toml"))
    assert suites
    for path in suites:
        load_suite(str(path))  # raises ValueError naming the problem


def test_auto_backend_needs_a_gpu_for_every_local_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    import commbench.cluster.launch as launch

    monkeypatch.setattr(launch, "has_gpus", lambda: 1)
    # one GPU, two ranks: a mixed nccl/gloo world would hang, so every rank must choose gloo
    assert launch.resolve_backend("auto", 0, 2) == launch.resolve_backend("auto", 1, 2) == "gloo"
    assert launch.resolve_backend("auto", 0, 1) == "nccl"
    with pytest.raises(ValueError, match="needs a GPU per rank"):
        launch.resolve_backend("nccl", 1, 2)
    monkeypatch.setattr(launch, "has_gpus", lambda: 0)
    assert launch.resolve_backend("auto", 0, 2) == "gloo"


# nccl-tests src/broadcast.cu, reduce.cu, sendrecv.cu (GetBw: factor 1), gather.cu, scatter.cu ((n-1)/n);
# doc/PERFORMANCE.md: Broadcast 1, Reduce 1.
@pytest.mark.parametrize("n", [2, 3, 8])
def test_rooted_and_p2p_bus_factors_match_nccl_tests(n: int) -> None:
    for name in ("broadcast", "reduce", "sendrecv", "pp_sendrecv"):
        assert get_collective(name).bus_factor(n) == 1.0
    for name in ("gather", "scatter"):
        assert get_collective(name).bus_factor(n) == pytest.approx((n - 1) / n)
    assert get_collective("sendrecv").latency_steps(n) == 1.0


@pytest.mark.parametrize("n", [2, 3, 8])
def test_rooted_and_p2p_size_definitions(n: int) -> None:
    total = 1024 * n
    for name in ("broadcast", "reduce", "sendrecv", "pp_sendrecv"):  # count = the buffer, size = count x width
        lay = get_collective(name).layout(total, n)
        assert (lay.input_numel, lay.output_numel, lay.count) == (total, total, total)
    g = get_collective("gather").layout(total, n)  # sendcount = count/nranks, recvcount = sendcount x nranks
    assert (g.input_numel, g.output_numel, g.count) == (total // n, total, total // n)
    s = get_collective("scatter").layout(total, n)  # recvcount = count/nranks, sendcount = recvcount x nranks
    assert (s.input_numel, s.output_numel, s.count) == (total, total // n, total // n)


def test_rooted_rounding_like_nccl_tests() -> None:
    # gather/scatter: (count/nranks) & ~(16/eltSize - 1), fp32 -> multiples of 4 per rank; the others unrounded
    for name in ("gather", "scatter"):
        assert get_collective(name).round_total(1024**2 // 4, 6) * 4 == 1048512
    for name in ("broadcast", "reduce", "sendrecv"):
        assert get_collective(name).round_total(257, 3) == 257


def test_rooted_and_p2p_references_against_hand_values() -> None:
    import torch

    a = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64)
    b = torch.tensor([10.0, 20.0, 30.0, 40.0], dtype=torch.float64)
    c = torch.tensor([100.0, 200.0, 300.0, 400.0], dtype=torch.float64)
    bc = get_collective("broadcast").configured(root=1)
    assert bc.reference([a, b, c], 0).tolist() == [10, 20, 30, 40]
    red = get_collective("reduce").configured(root=2)
    assert red.reference([a, b, c], 2).tolist() == [111, 222, 333, 444]
    assert red.reference([a, b, c], 0).numel() == 0  # off the root nothing is defined
    ga = get_collective("gather").configured(root=1)
    assert ga.reference([a[:2], b[:2]], 1).tolist() == [1, 2, 10, 20] and ga.reference([a[:2], b[:2]], 0).numel() == 0
    sc = get_collective("scatter").configured(root=1)
    assert sc.reference([a, b], 0).tolist() == [10, 20] and sc.reference([a, b], 1).tolist() == [30, 40]
    ring = get_collective("sendrecv")  # rank r receives (r-1) mod n's buffer
    assert ring.reference([a, b, c], 0).tolist() == [100, 200, 300, 400]
    assert ring.reference([a, b, c], 2).tolist() == [10, 20, 30, 40]
    pp = get_collective("pp_sendrecv")  # rank r receives r-1's; the first stage nothing
    assert pp.reference([a, b, c], 1).tolist() == [1, 2, 3, 4] and pp.reference([a, b, c], 0).numel() == 0


def test_reduction_ops_against_hand_values() -> None:
    import torch

    a = torch.tensor([1.0, -2.0, 3.0], dtype=torch.float64)
    b = torch.tensor([4.0, 5.0, -6.0], dtype=torch.float64)
    ar = get_collective("all_reduce")
    expect = {"sum": [5, 3, -3], "prod": [4, -10, -18], "min": [1, -2, -6], "max": [4, 5, 3], "avg": [2.5, 1.5, -1.5]}
    for op, want in expect.items():
        assert ar.configured(op=op).reference([a, b], 0).tolist() == want
        assert ar.configured(op=op).redop == op
    assert get_collective("all_gather").configured(op="max").redop == "none"  # not a reduction: the op means nothing
    with pytest.raises(ValueError, match="unknown reduction op 'mean'.*avg"):
        ar.configured(op="mean")


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_check_expectations_agree_with_references_for_every_collective(n: int) -> None:
    from commbench.measure.check import _rule_holds  # noqa: PLC2701 - the rule the checks rely on

    # the built-ins: a test module's plugin collective (test_codec_extension's toy) is registered at its import
    for name in [c for c in COLLECTIVES.names() if type(get_collective(c)).__module__.startswith("commbench.")]:
        for root in sorted({0, n - 1}):
            for op in ("sum", "max", "prod", "avg"):
                coll = get_collective(name).configured(root=root, op=op)
                if name == "pp_sendrecv" and n < 2:
                    continue
                for rank in range(n):
                    assert _rule_holds(coll, n, rank), (name, root, op, n, rank)


def test_configuration_refusals_are_one_line() -> None:
    from commbench.measure.collectives import check_configuration

    with pytest.raises(ValueError, match=r"broadcast: root 4 \(-r\) is not a rank of a group of 2 \(valid roots: 0..1\)"):
        check_configuration(["broadcast"], 4, "sum", "gloo", 2)
    with pytest.raises(ValueError, match="gloo has no 'avg'"):
        check_configuration(["reduce"], 0, "avg", "gloo", 2)
    check_configuration(["reduce", "all_gather"], 1, "avg", "nccl", 2)  # NCCL averages; a root inside the world
    check_configuration(["all_gather"], 5, "avg", "gloo", 2)  # neither rooted nor a reduction: nothing to refuse
    assert get_collective("pp_sendrecv").unsupported("gloo", 1) is not None


def test_resume_keeps_the_root_and_the_op() -> None:
    from commbench.cli.orchestrate import resume_conflicts

    old = {"suite": suite_from_dict({"root": 1}).to_dict()}
    assert resume_conflicts(old, suite_from_dict({"root": 1})) == []
    assert resume_conflicts(old, suite_from_dict({"root": 0})) == ["root 1 -> 0 (-r/--root)"]
    assert resume_conflicts(old, suite_from_dict({"root": 1, "op": "max"})) == ["op 'sum' -> 'max' (-o/--op)"]
    older = {"suite": {"collectives": ["all_reduce"]}}  # a run from before -r/-o: nothing to compare them with
    assert resume_conflicts(older, suite_from_dict({"collectives": ["all_reduce"], "op": "max"})) == []
