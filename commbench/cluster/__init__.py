"""The world commbench runs in: discovery (torchrun, Slurm, MPI) or a local spawn, devices, supervision, node facts and run metadata, emulated clusters."""
