"""Collective microbenchmarks: the collective, precision and codec registries, fp8 numerics, the chunked algorithm, groups, correctness checks, timing, the sweep and its console."""
