"""`python -m bench.compose --short` measures every figure it declares: the bench of the
compose stack (time to solve through `docker compose` beside `rlfleet up`) runs here, where a
Docker engine is, as every other bench runs in tests/integration/test_benches.py: the same
checks on its last JSON line (no `error`, every figure present and not null), never on the
figures' values.

Its short run builds the image the ordinary way (a cache hit after test_compose.py's build),
runs one seed with one collector to an evaluation return of 195 through the stack and then
through `rlfleet up` on the Redis at 127.0.0.1:6379, and brings the stack down.
"""

from __future__ import annotations

import pytest
from integration.helpers import requires_redis
from integration.test_benches import check_figures, run_short

# A cached build, a stack's start and stop, and two short runs; a fresh build (no cache)
# installs torch into the image and takes minutes more.
TIMEOUT_S = 900.0


@requires_redis
@pytest.mark.timeout(TIMEOUT_S + 180)
def test_the_compose_bench_measures_every_figure_in_short_mode(docker_env, tmp_path):
    engine = {k: v for k, v in docker_env.items() if k.startswith("DOCKER_")}
    check_figures("compose", run_short("compose", tmp_path, env=engine, timeout_s=TIMEOUT_S))
