"""rlfleet on a Slurm cluster: `rlfleet slurm submit CONFIG` and the jobs it starts.

One job runs the coordinator and its keeper (`jobs.py`, `keeper.py`); the keeper submits the
learner and collector jobs, one role per job, and keeps as many as the run wishes for
(`rlfleet scale` changes the wish; a job Slurm ends or loses is replaced or requeued). Every
job finds the coordinator through the run directory (`rendezvous.py`), which must be on a
path every node mounts, so nobody types a hostname. The job scripts are written to
`<run-dir>/slurm/` (`scripts.py`), where a person can read them, change them and submit them
with `sbatch` by hand. docs/slurm.md has the commands.
"""
