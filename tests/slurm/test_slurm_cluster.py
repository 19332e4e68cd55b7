"""The Slurm test cluster itself (`cluster.py`), in one short run: it starts with every
node idle; a job pinned to a node runs there, on that node's own host (its name and
address); a job calls `sbatch` from its node, so nodes reach slurmctld over the network; a
killed node is reported down within seconds; and closing the cluster leaves nothing behind
(no namespace, daemon or job process)."""

from __future__ import annotations

import shutil
import time

import pytest

from .cluster import SlurmCluster, unavailable

UNAVAILABLE = unavailable()
pytestmark = pytest.mark.skipif(UNAVAILABLE is not None, reason=f"slurm: {UNAVAILABLE}")

DOWN_WITHIN_S = 15.0  # measured: about 6 s (SlurmdTimeout=3, a ping a second)


@pytest.mark.slow  # the harness alone: test_slurm.py runs it whole in the default suite
def test_cluster_runs_jobs_on_its_nodes_and_sees_one_die(tmp_path) -> None:
    ip = shutil.which("ip") or "/usr/sbin/ip"
    cluster = SlurmCluster(tmp_path / "slurm")
    try:
        cluster.start()
        out = cluster.workdir
        where = ('echo "$SLURMD_NODENAME $(hostname) '
                 f'$({ip} -4 -o addr show eth0 | awk \'{{print $4}}\')" > {out}/on-$1\n')
        job = out / "where.sh"
        job.write_text("#!/bin/bash\n" + where + 'if [ "$1" = n1 ]; then\n'
                       "  sbatch --parsable -w n2 -J child -o /dev/null "
                       f"--wrap 'echo $SLURM_JOB_ID $SLURMD_NODENAME > {out}/child' "
                       f"> {out}/child-id\nfi\n")
        ids = {n: cluster.sbatch(job, "-w", n, "-J", f"on-{n}", "-o", f"{out}/{n}.out",
                                  script_args=[n])
               for n in cluster.names}
        for name, job_id in ids.items():
            state = cluster.wait_state(job_id, ("COMPLETED", "FAILED"), 20)
            assert state == "COMPLETED", (name, cluster.job(job_id),
                                          (out / f"{name}.out").read_text())
            node, hostname, addr = (out / f"on-{name}").read_text().split()
            assert (node, hostname, addr) == (name, name, f"{cluster.host(name).ip}/24")

        child = int((out / "child-id").read_text())  # submitted from inside the job on n1
        assert cluster.wait_state(child, ("COMPLETED", "FAILED"), 20) == "COMPLETED"
        assert (out / "child").read_text().split() == [str(child), "n2"]

        t0 = time.monotonic()
        cluster.kill_node("n3")
        states = cluster.wait_nodes(["n3"], ("DOWN",), DOWN_WITHIN_S)
        print(f"n3 {states['n3']} {time.monotonic() - t0:.1f} s after it was killed; "
              f"the cluster started in {cluster.started_s:.1f} s")
        assert cluster.node_state("n1") == "IDLE"
    finally:
        killed_hard = cluster.close()
    assert killed_hard == []
    assert cluster.leftovers() == []
