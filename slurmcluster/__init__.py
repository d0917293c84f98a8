"""A real Slurm on one machine, for tests and for trying Regatta by hand.

munged, slurmctld and several `slurmd -N nX` from Debian's packages (slurm-wlm
22.05), run as local processes on free loopback ports, with every file (the
munge key and socket, slurm.conf, spool, state, logs, pid files) in one state
folder: two of them on one machine never meet. Fake GPUs are empty files named
by gres.conf. `python -m slurmcluster --help` lists the verbs; docs/slurm.md
says what Regatta needs from a real Slurm cluster.
"""
