"""An example commbench plugin, installed as its own distribution: importing it registers

- a codec, ``example_int8`` (fp32 as int8 with one float32 absmax scale per chunk): a sweep precision of the
  same name (``run --precisions fp32,example_int8``) and a DDP gradient hook (:mod:`commbench_example.codec`);
- a training policy, ``example_int8_hook``: DDP whose gradients are reduced through that codec
  (:mod:`commbench_example.policy`);
- a report figure, ``example_wire_ratio``: the bytes each precision put on the wire per fp32 byte, drawn from the
  run's results table (:mod:`commbench_example.figure`).

commbench finds it through the entry point group ``commbench.plugins`` (see ``pyproject.toml``) or
``--plugin commbench_example``; nothing in commbench names it.
"""

from commbench_example import codec, figure, policy

__all__ = ["codec", "figure", "policy"]
