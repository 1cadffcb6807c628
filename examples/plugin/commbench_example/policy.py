"""The ``example_int8_hook`` training policy: commbench's DDP strategy with the example codec as gradient hook.

A policy composes existing strategy objects; the runner asks them everything (bytes per step, memory, the
underflow threshold, which commbench measures on the codec itself), so registering it is the whole recipe.
"""

from __future__ import annotations

from commbench.training.policies import Policy, register_policy
from commbench.training.strategies import DDP, CodecHook
from commbench_example.codec import NAME

POLICY = register_policy(
    Policy(
        name=f"{NAME}_hook",
        family="ddp",
        description="DDP, fp32 compute, gradients reduced as int8 with one scale per chunk (example plugin)",
        sharding=DDP(),
        grad_comm=CodecHook(NAME),
    )
)
