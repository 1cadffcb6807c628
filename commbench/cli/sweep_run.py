"""The sweep of a run on every rank, pass by pass, and what survives a stop.

Every pass visits the whole grid and adds its share of rounds to each group (:mod:`commbench.measure.sweep`).
After each group's pass, rank 0 journals the pass's rounds (``passes.jsonl``, :mod:`commbench.measure.passes`) and
writes the group's rows: provisional ones (``partial``) after every pass but the last, with a console line of the
current estimates; the final rows (the nccl-tests table) after the last. So a Ctrl-C, a SIGTERM or a failed rank at
any point keeps every pass that finished, and the exchanged rounds of the pass it cut short (an incomplete entry); the report can be drawn from what is there (``metadata.json`` says
``partial`` and why); and ``--resume`` rebuilds each unfinished group from the journal and measures only the passes
it lacks (a size whose passes are all journaled is not measured again). At ``--passes 1`` a size's rows print as
it finishes, like nccl-tests.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import torch.distributed as dist

from commbench.core.suite import SuiteConfig
from commbench.core.units import format_size
from commbench.measure import console
from commbench.measure.passes import PARTIAL_STATE, GroupState, group_key, pass_entry, pass_line, restore
from commbench.measure.sweep import Group, Sweep, agree_done, iter_groups, signal_hook
from commbench.store.results import PASSES_TABLE, crossover

__all__ = ["mark_partial", "run_sweep"]


def run_sweep(suite: SuiteConfig, d: Any, writer: Any, *, quiet: bool) -> None:
    """Every pass of every unfinished group, then the run's summary lines (rank 0)."""
    sweep = Sweep(suite, d)
    done = agree_done(d, writer.done_keys() if writer is not None else set())
    todo = list(iter_groups(sweep, done))
    keys = [group_key(g.collective.name, g.kind, g.fp32_bytes, suite.payload) for g, _ in todo]
    states = restored_states(d, writer, todo, keys)
    passes = suite.timing.passes
    lead = d.rank == 0
    left = sum(len(i) * (passes - (st.passes if st is not None else 0)) for (_, i), st in zip(todo, states, strict=True))
    if lead:
        console.print_skipped(sweep.skipped(), d.backend, sweep.skipped_groups())
        journaled = sum(st.passes for st in states if st is not None)
        if done or journaled:
            console.print_resume(writer.dir if writer is not None else "", len(done), sum(len(i) for _, i in todo))
        if journaled:
            for line in console.comment(
                f"{journaled} pass(es) of {sum(st is not None for st in states)} unfinished size(s) are in the "
                "journal (passes.jsonl) and reused: only the passes they lack are measured"
            ):
                print(line)
    progress = console.SweepProgress(left, enabled=lead and not quiet)
    printer = console.PointPrinter()
    try:
        for p in range(passes):
            for i, (group, indices) in enumerate(todo):
                measured = states[i] is None or states[i].passes <= p  # type: ignore[union-attr]
                states[i] = _visit(sweep, writer, printer, keys[i], group, indices, states[i], p, quiet=quiet)
                if measured:  # a pass in the journal is not measured again, nor counted
                    progress.advance(_where(group, p, passes), len(indices))
            signal_hook(d.rank, p + 1)
    except BaseException as e:  # Ctrl-C, SIGTERM, a failed rank: what was journaled stays; the metadata says so
        if lead and writer is not None:
            mark_partial(writer, e, passes)
        raise
    finally:
        progress.stop()
    if lead and writer is not None:
        _summary(sweep, writer)


def _where(group: Group, p: int, passes: int) -> str:
    where = f"{group.collective.name} {format_size(group.fp32_bytes)} [{group.kind}]"
    return f"pass {p + 1}/{passes} {where}" if passes > 1 else where


def _visit(
    sweep: Sweep, writer: Any, printer: console.PointPrinter, key: tuple[Any, ...], group: Group, indices: set[int], state: GroupState | None,
    p: int, *, quiet: bool,
) -> GroupState | None:  # fmt: skip
    """Pass ``p`` of ``group``: measured unless the journal holds it, journaled, and its rows written (and printed)
    on rank 0. Returns the state the next pass continues (None after the last)."""
    passes = sweep.suite.timing.passes
    last = p == passes - 1
    if state is None or state.passes <= p:
        prior = state.rounds if state is not None else None
        try:
            state = sweep.sample_group(group, state, p)
        except BaseException as e:
            _keep_cut_pass(sweep, writer, key, group, indices, getattr(e, PARTIAL_STATE, None), prior, p)
            raise
        if state is None:
            return None
        if writer is not None:
            names = [group.points[c][1].precision.name for c in state.live]
            writer.append_journal(PASSES_TABLE, [pass_entry(key, names, state, prior, p, passes)])
    elif not last:
        return state  # this pass is in the journal; its provisional rows were written when it was measured
    points, ranks = sweep.finish_group(group, state, indices, partial=not last)
    if writer is not None:
        writer.add([pt for _, pt in points])
        if last:
            writer.add(ranks)
            printer.rows([pt.as_dict() for _, pt in points], group.collective.redop)  # one size: legend above its rows
        elif not quiet and points:
            where = f"{group.collective.name} {format_size(group.fp32_bytes)} [{group.kind}]"
            for line in console.comment(pass_line(where, p, passes, [pt.as_dict() for _, pt in points])):
                print(line, flush=True)
    return None if last else state


def _keep_cut_pass(
    sweep: Sweep, writer: Any, key: tuple[Any, ...], group: Group, indices: set[int], cut: GroupState | None,
    prior: Any, p: int,
) -> None:  # fmt: skip
    """A pass stopped after some rounds were exchanged (``cut``): journal them as an incomplete pass and write the
    group's provisional rows from everything so far, on rank 0. Never raises: the stop's own exception goes on."""
    if cut is None or writer is None:
        return
    try:
        names = [group.points[c][1].precision.name for c in cut.live]
        passes = sweep.suite.timing.passes
        writer.append_journal(PASSES_TABLE, [pass_entry(key, names, cut, prior, p, passes, complete=False)])
        points, _ = sweep.finish_group(group, cut, indices, partial=True)
        writer.add([pt for _, pt in points])
    except Exception as e:  # the journal line is what matters; a row that cannot be built is said, not raised
        print(f"commbench: warning: rows of the pass cut short not written ({type(e).__name__}: {e})", file=sys.stderr)


def restored_states(
    d: Any, writer: Any, todo: list[tuple[Group, set[int]]], keys: list[tuple[Any, ...]]
) -> list[GroupState | None]:
    """Each unfinished group's state after its journaled passes (``--resume``), on every rank: rank 0 reads the
    journal (the only rank that has the run directory) and sends the states to the others."""
    states: list[Any] = [None] * len(todo)
    if d.rank == 0 and writer is not None:
        names = {k: [pt.precision.name for _, pt in g.points] for (g, _), k in zip(todo, keys, strict=True)}
        found = restore(writer.journal(PASSES_TABLE), names)
        states = [found.get(k) for k in keys]
    box: list[Any] = [states]
    dist.broadcast_object_list(box, src=0)
    return list(box[0])


def mark_partial(writer: Any, why: BaseException, passes: int) -> None:
    """Record in ``metadata.json`` that the run stopped before its sweep finished: why, and how many points have
    final and provisional rows (the report says so at the top)."""
    rows = writer.rows["results"]
    provisional = [r for r in rows if r.get("partial") is True]
    reason = f"interrupted ({str(why) or 'SIGINT'})" if isinstance(why, KeyboardInterrupt) else f"{type(why).__name__}: {why}"
    meta = json.loads((writer.dir / "metadata.json").read_text())
    meta["partial"] = {
        "reason": reason.splitlines()[0] if reason else type(why).__name__,
        "final_points": len(rows) - len(provisional),
        "provisional_points": len(provisional),
        "passes": passes,
        "fewest_passes_done": min((int(r.get("passes_done") or 0) for r in provisional), default=passes),
    }
    writer.write_metadata(meta)


def _summary(sweep: Sweep, writer: Any) -> None:
    """After the sweep, on rank 0: skipped precisions into the metadata, then noise, crossover, stragglers and
    link lines."""
    import pandas as pd

    from commbench.measure.stragglers import stragglers
    from commbench.views.findings import link_findings

    if sweep.unavailable:
        meta = json.loads((writer.dir / "metadata.json").read_text())
        meta["skipped"] = [*[s for s in meta.get("skipped") or [] if s not in sweep.unavailable], *sweep.unavailable]
        writer.write_metadata(meta)
    df = pd.DataFrame(writer.rows["results"])
    if not df.empty:
        console.print_noise_warning(df)
    cross = crossover(df)
    writer.write_crossover(cross)
    console.print_crossover(cross)
    console.print_stragglers(stragglers(pd.DataFrame(writer.rows["ranks"])))
    # "is my number good?": each series' largest size as a share of the link it crosses (the report's finding)
    for line in link_findings(df):
        for out in console.comment(line):
            print(out)
