"""Self-play end to end: `rlfleet up` on tic-tac-toe (coordinator, learner, two battle
collectors as local processes). The collectors play the league's opponents and never an
illegal move (a collector stops on one); every stored chunk holds only legal moves of the
learning side and both sides' versions; snapshots join the league; evaluations report win,
draw and loss rates per opponent and seat; the league is written for `rlfleet plot`, and
the policy learns to beat the random player."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

pytest.importorskip("pettingzoo", reason="the games extra: pip install -e '.[games]'")
# The league learns within a wall-clock budget: on a machine shared with another test it
# plays too few games to beat the random player. `make test` runs it on its own.
pytestmark = pytest.mark.alone

from rlfleet.shared.contract.codec import decode_arrays  # noqa: E402
from rlfleet.shared.infra.storage import DirectoryStorage, snapshot_blob  # noqa: E402

from .helpers import REPO  # noqa: E402


def selfplay_config(tmp_path: Path, game: str = "tictactoe") -> Path:
    data = yaml.safe_load((REPO / "configs" / f"{game}-selfplay.yaml").read_text())
    data["eval"].update(every_env_steps=15_000, episodes=50)
    data["league"]["stop_when"] = []  # run the whole budget
    data["league"]["snapshot_every_versions"] = 200
    data["stop"] = {"max_env_steps": 70_000, "max_wall_s": 150}
    path = tmp_path / f"{game}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_a_tictactoe_league_trains_through_the_cluster(launch, tmp_path):
    run_dir = tmp_path / "run"
    up = launch("--config", str(selfplay_config(tmp_path)), "--collectors", "2",
                "--run-dir", str(run_dir), "--quiet", "--max-restarts", "0")
    code = up.wait(timeout=240)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert code == 3 and summary["error"] is None, (code, summary, up.stderr[-3000:])
    assert summary["restarts"] == {}  # no collector died on an illegal move
    assert summary["env_steps"] >= 70_000

    league = json.loads((run_dir / "league.json").read_text())
    kinds = {p["kind"] for p in league["players"]}
    assert kinds == {"main", "snapshot", "bot"}
    snapshots = [p for p in league["players"] if p["kind"] == "snapshot"]
    storage = DirectoryStorage(run_dir / "storage")
    for p in snapshots:  # every snapshot's weights are pinned
        assert storage.get_blob(snapshot_blob(p["policy_version"])) is not None
    assert league["games"] == summary["episodes"]
    assert league["ratings"]["main"]

    chunks = storage.list_chunks()[:50]
    assert chunks
    versions_met = set()
    for blob in storage.get_chunks(chunks):
        arrays, meta = decode_arrays(blob)
        n = len(arrays["action"])
        assert arrays["action_mask"][range(n), arrays["action"]].all()
        assert arrays["next_action_mask"].shape == arrays["action_mask"].shape
        versions_met |= set(arrays["opponent_version"].tolist())
        assert int(meta["policy_version"]) >= -1
    assert -1 in versions_met and len(versions_met) > 1  # bots, and policies by version

    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text()
               .splitlines()]
    evals = [r for r in records if r.get("scope") == "eval"]
    assert evals
    last = evals[-1]
    for opponent in ("bot-random", "bot-perfect"):
        for seat in ("", "first/", "second/"):
            rates = [last[f"eval/vs_{opponent}/{seat}{k}"] for k in ("win", "draw", "loss")]
            assert sum(rates) == pytest.approx(1.0)
    assert last["eval/vs_bot-random/win"] >= 0.6  # it learned something in 70k moves
    assert last["eval/vs_bot-perfect/win"] == 0.0  # nobody beats the solver
