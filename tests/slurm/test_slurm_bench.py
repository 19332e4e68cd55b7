"""`python -m bench.slurm --short` measures every figure it declares: the bench of a run
through Slurm (CartPole DQN through `rlfleet slurm submit` on tests/slurm/cluster.py's cluster,
beside `rlfleet up`) runs here, where a Slurm cluster can be built, as every other bench runs
in tests/integration/test_benches.py: the same checks on its last JSON line, never on the
figures' values. Its short run: one seed, solved at 195. The bench imports the cluster as
this suite does, with tests/ on the import path (`PYTHONPATH`)."""

from __future__ import annotations

import os

import pytest
from integration.helpers import REPO
from integration.test_benches import check_figures, run_short

from .cluster import unavailable

UNAVAILABLE = unavailable()
pytestmark = pytest.mark.skipif(UNAVAILABLE is not None, reason=f"slurm: {UNAVAILABLE}")


def test_the_slurm_bench_measures_every_figure_in_short_mode(tmp_path):
    path = os.pathsep.join(p for p in (str(REPO / "tests"), os.environ.get("PYTHONPATH")) if p)
    check_figures("slurm", run_short("slurm", tmp_path, env={"PYTHONPATH": path}))
