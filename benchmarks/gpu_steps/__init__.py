"""The steps of ``benchmarks/gpu_check.sh``, split by job: the grid and settings (``constants``), the step records and
the summary (``report``), the checks over a run's results (``checks``), the codec on CUDA (``codec``), the DDP hook
against its synchronous reference (``hook``), running the CLI from a step (``runs``), the steps (``steps``, and
``probes`` for the checks of devices, memory, timing and the supervisor). ``benchmarks/gpu_check.py`` is the entry
point and re-exports what the tests use."""
