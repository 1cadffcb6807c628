"""Other tools' names for commbench's things, and the closest valid names for a typo.

nccl-tests' data types (``-d float``, ``half``, ``bfloat16``, ``f8e4m3``: ``test_typenames`` in nccl-tests
``src/common.cu``), torch's dtype names (``float32``, ``torch.bfloat16``, ``float8_e4m3fn``) and nccl-tests' binary
stems (``alltoall`` of ``alltoall_perf``) are accepted where they mean one commbench name (:data:`ALIASES`); a name
that means something commbench does not measure (``double``, ``int8``) is refused with the reason
(:data:`REFUSED`). The fp8 names map as commbench's nccl-tests importer maps them (``store.nccl_common.NCCL_TYPES``),
so a run measured with ``-d f8e4m3`` and an imported nccl-tests log of that type carry the same precision name.
Pure data and :mod:`difflib`; the registries (:mod:`commbench.core.registry`) and the suite read it.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

_FLOAT64 = (
    "{name!r} is float64: commbench measures fp32 and the narrower formats a float64 reference judges (its error "
    "columns), not float64 itself"
)
_INTEGER = (
    "{name!r} is an integer type: commbench measures floating-point precisions of a float tensor (fp8 codes move "
    "as uint8 inside the fp8 precisions)"
)

ALIASES: dict[str, dict[str, str]] = {
    "precision": {
        # nccl-tests' -d names (test_typenames); rccl-tests' fp8_e4m3/fp8_e5m2 are commbench's own names
        "float": "fp32",
        "half": "fp16",
        "bfloat16": "bf16",
        "f8e4m3": "fp8_e4m3",
        "f8e5m2": "fp8_e5m2",
        # torch's dtype names, bare and qualified
        **{f"{q}{t}": p for q in ("", "torch.") for t, p in (
            ("float32", "fp32"), ("float16", "fp16"), ("bfloat16", "bf16"),
            ("float8_e4m3fn", "fp8_e4m3"), ("float8_e5m2", "fp8_e5m2"),
        )},  # fmt: skip
        "torch.float": "fp32",
        "torch.half": "fp16",
    },
    "collective": {
        # nccl-tests' binary stems (and the same with _perf), where they differ from commbench's names
        "allreduce": "all_reduce",
        "allgather": "all_gather",
        "reducescatter": "reduce_scatter",
        "alltoall": "all_to_all",
    },
}
"""Kind -> other tools' name -> commbench's name. A name with an option keeps it (``f8e4m3:block128``)."""

REFUSED: dict[str, dict[str, str]] = {
    "precision": {
        **{n: _FLOAT64 for n in ("double", "float64", "torch.float64", "torch.double", "fp64")},
        **{f"{s}int{b}": _INTEGER for s in ("", "u") for b in (8, 16, 32, 64)},
        **{f"torch.{s}int{b}": _INTEGER for s in ("", "u") for b in (8, 16, 32, 64)},
    },
}
"""Kind -> a name that means something commbench does not measure -> why (``{name!r}`` is filled in)."""

ALL = "all"
"""nccl-tests' ``-d all`` (``-o all``): every registered name of the kind."""


def canonical(kind: str, name: str) -> str:
    """commbench's name for ``name`` (an alias of another tool, any case; ``_perf`` and an option kept)."""
    base, sep, option = name.strip().partition(":")
    table = ALIASES.get(kind, {})
    for key in (base, base.lower(), base.lower().removesuffix("_perf")):
        if key in table:
            return table[key] + sep + option
    if kind == "collective" and base.lower().endswith("_perf"):
        return base.lower().removesuffix("_perf") + sep + option
    return name.strip()


def refused(kind: str, name: str) -> str | None:
    """Why ``name`` (a known name of another tool) has no meaning here, or None."""
    base = name.strip().partition(":")[0]
    why = REFUSED.get(kind, {}).get(base) or REFUSED.get(kind, {}).get(base.lower())
    return why.format(name=base) if why else None


def closest(name: str, valid: Iterable[str], kind: str = "", n: int = 3) -> list[str]:
    """Up to ``n`` valid names closest to ``name`` (difflib's ratio >= 0.6), best first; another tool's alias that
    is close counts as the name it means."""
    base = name.strip().partition(":")[0].lower()
    valid = list(valid)
    pool = {v.lower(): v for v in valid}
    pool.update({a: t for a, t in ALIASES.get(kind, {}).items() if t in valid})
    out: list[str] = []
    for hit in difflib.get_close_matches(base, list(pool), n=n * 2, cutoff=0.6):
        if pool[hit] not in out:
            out.append(pool[hit])
    if not out:  # a prefix that is no typo: 'fp8' for fp8_e4m3 / fp8_e5m2
        out = [v for v in valid if v.lower().startswith(base)] if len(base) >= 2 else []
    return out[:n]


def did_you_mean(name: str, valid: Iterable[str], kind: str = "") -> str:
    """``"; did you mean X or Y?"`` naming the closest valid names, or "" when none is close."""
    near = closest(name, valid, kind)
    if not near:
        return ""
    return "; did you mean " + " or ".join(repr(v) for v in near) + "?"


def unknown(kind: str, name: str, valid: Iterable[str], *, label: str | None = None) -> str:
    """The one line for an unknown name: the reason when another tool's name means nothing here, the valid
    choices, and the closest ones."""
    valid = list(valid)
    what = label or kind
    why = refused(kind, name)
    head = f"unknown {what} {name!r}" + (f": {why}" if why else "")
    return f"{head}; valid choices: {', '.join(valid)}" + ("" if why else did_you_mean(name, valid, kind))


__all__ = ["ALIASES", "ALL", "REFUSED", "canonical", "closest", "did_you_mean", "refused", "unknown"]
