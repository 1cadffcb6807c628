"""``python -m commbench.emulate``: the emulated-cluster command (:mod:`commbench.cluster.emulate`)."""

from commbench.cluster.emulate import main

if __name__ == "__main__":
    raise SystemExit(main())
