"""``python -m commbench.emulate``: the emulated-cluster command (:mod:`commbench.cluster.emulate_jobs`)."""

from commbench.cluster.emulate_jobs import main

if __name__ == "__main__":
    raise SystemExit(main())
