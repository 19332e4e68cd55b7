"""The trained policy in use: `rlfleet play` and `rlfleet serve-policy` on a run's best policy.

A short PPO run on CartPole (a policy that plays, not a solved one) feeds the command-line
tests: `play` prints its episodes and writes a video; `serve-policy` runs as a process with a
token and a small body limit, and answers good requests (its deterministic actions are the
policy's greedy ones, computed here from the same file) and bad ones (each a JSON 4xx naming
the field). Policies of other kinds (DQN, continuous PPO with observation normalisation, BC,
an Atari CNN on uint8 frames) are served in-process from run directories made here with
untrained weights: what the server checks and answers does not depend on how good they are.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import requests
import yaml

from bench.serve_policy import observations
from rlfleet.shared.infra.auth import TOKEN_ENV, TOKEN_FILE_ENV

from .helpers import REPO, Processes, Up, config_from, free_port, wait_for

TOKEN = "policy-use-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
MAX_BODY = 1_000_000  # the served process's RLFLEET_MAX_BODY_BYTES: a 413 without 8 MB
USERLAND = REPO / "tests" / "userland"


def _cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlfleet", *args], capture_output=True,
                          text=True, cwd=REPO, timeout=180, env={**_clean_env(), **(env or {})})


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in (TOKEN_ENV, TOKEN_FILE_ENV)}


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CartPole PPO run of 6,000 env steps, evaluated every 2,000: a best policy that
    plays (how well does not matter here)."""
    tmp = tmp_path_factory.mktemp("trained")
    config = config_from(tmp, "cartpole-ppo.yaml",
                         eval={"every_env_steps": 2000, "episodes": 4, "num_envs": 4},
                         stop={"max_env_steps": 6000, "max_wall_s": 120})
    run_dir = tmp / "run"
    up = Up("--config", str(config), "--collectors", "1", "--run-dir", str(run_dir), "--quiet")
    try:
        code = up.wait(timeout=240)
    finally:
        up.kill_leftovers()
    assert code in (0, 3), f"exit code {code}:\n{up.stderr[-3000:]}"  # solved, or stopped
    assert (run_dir / "best_policy.safetensors").is_file()
    return run_dir


def _policy_of(run_dir: Path):
    """The run's best policy, loaded here the plain way (not through the code under test)."""
    from rlfleet.shared.algos.registry import make_policy
    from rlfleet.shared.contract.codec import decode_weights
    from rlfleet.shared.envs.make import run_spec
    from rlfleet.shared.run.config import load_config

    cfg = load_config(run_dir / "config.yaml")
    state, meta = decode_weights((run_dir / "best_policy.safetensors").read_bytes())
    policy = make_policy(cfg.algo, run_spec(cfg), 0)
    policy.load_policy(int(meta["policy_version"]), state)
    return policy, int(meta["policy_version"])


# -- rlfleet play -----------------------------------------------------------------------------

def _episode_rows(stdout: str) -> list[tuple[int, float, int]]:
    rows = []
    for line in stdout.splitlines():
        cells = [c.strip() for c in line.strip("│┃ ").split("│")]
        if len(cells) == 3 and cells[0].isdigit():
            rows.append((int(cells[0]), float(cells[1]), int(cells[2])))
    return rows


def test_play_prints_every_episode_and_writes_a_video(trained_run: Path, tmp_path: Path):
    from rlfleet.shared.telemetry.video import read_frames

    video = tmp_path / "out" / "play.mp4"
    done = _cli("play", str(trained_run), "--episodes", "3", "--video", str(video))
    assert done.returncode == 0, done.stderr[-3000:]
    rows = _episode_rows(done.stdout)
    assert [r[0] for r in rows] == [1, 2, 3], done.stdout
    assert all(ret == length for _, ret, length in rows)  # CartPole: +1 a step
    mean = next(line for line in done.stdout.splitlines() if "mean" in line)
    assert f"{np.mean([r[1] for r in rows]):.2f}" in mean
    assert "deterministic" in done.stdout
    frames = read_frames(video)
    # one frame a step of the first episode, as the env rendered it
    assert frames.shape[0] == rows[0][2] > 10 and frames.shape[1:] == (400, 600, 3)

    # deterministic by default: the same seed plays the same episodes
    again = _cli("play", str(trained_run), "--episodes", "3")
    assert again.returncode == 0 and _episode_rows(again.stdout) == rows
    # --stochastic acts as collectors do, and still plays whole episodes
    sampled = _cli("play", str(trained_run), "--episodes", "2", "--stochastic", "--seed", "5")
    assert sampled.returncode == 0, sampled.stderr[-3000:]
    assert len(_episode_rows(sampled.stdout)) == 2 and "stochastic" in sampled.stdout


def _config(base: str, **changes: dict) -> dict:
    """configs/<base> with per-section changes (each section's fields updated)."""
    data = yaml.safe_load((REPO / "configs" / base).read_text())
    for section, values in changes.items():
        data.setdefault(section, {}).update(values)
    return data


def _untrained_run(tmp_path: Path, name: str, data: dict, version: int = 7) -> Path:
    """A run directory as `rlfleet up` leaves it (config.yaml, best_policy.safetensors), with
    a freshly initialised policy as its best one."""
    from rlfleet.shared.algos.registry import make_policy
    from rlfleet.shared.contract.codec import encode_weights
    from rlfleet.shared.envs.make import run_spec
    from rlfleet.shared.run.config import load_config
    from rlfleet.shared.util.moments import RunningMoments

    run_dir = tmp_path / name
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    cfg = load_config(run_dir / "config.yaml")
    policy = make_policy(cfg.algo, run_spec(cfg), 123)
    norm = getattr(getattr(policy, "net", None), "obs_norm", None)
    if norm is not None:  # statistics far from (0, 1), so a server that skips them is caught
        dim = run_spec(cfg).obs_shape[0]
        norm.merge(RunningMoments(100.0, np.linspace(-2.0, 2.0, dim), np.full(dim, 400.0)))
    (run_dir / "best_policy.safetensors").write_bytes(
        encode_weights(policy.policy_state(), {"policy_version": str(version)}))
    return run_dir


def test_play_errors_are_one_line_with_exit_code_2(trained_run: Path, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch):
    not_a_run = _cli("play", str(tmp_path))
    assert not_a_run.returncode == 2
    assert not_a_run.stderr.strip() == (f"rlfleet play: {tmp_path} is not a run directory: "
                                        "it has no config.yaml")
    never_evaluated = tmp_path / "fresh"
    never_evaluated.mkdir()
    shutil.copy(trained_run / "config.yaml", never_evaluated / "config.yaml")
    fresh = _cli("play", str(never_evaluated))
    assert fresh.returncode == 2 and len(fresh.stderr.strip().splitlines()) == 1
    assert "no best_policy.safetensors" in fresh.stderr
    # an env whose constructor takes no render_mode (the user's env of test_algorithms)
    monkeypatch.syspath_prepend(str(USERLAND))
    line_walk = _untrained_run(tmp_path, "line-walk", _config(
        "cartpole-dqn.yaml", env={"id": "my_rl:LineWalk", "num_envs": 2}))
    blind = _cli("play", str(line_walk), "--episodes", "1", "--video",
                 str(tmp_path / "x.mp4"), env={"PYTHONPATH": str(USERLAND)})
    assert blind.returncode == 2 and len(blind.stderr.strip().splitlines()) == 1, blind.stderr
    assert "--video: env 'my_rl:LineWalk' cannot render" in blind.stderr
    assert not (tmp_path / "x.mp4").exists()
    # without a video the same run plays
    plays = _cli("play", str(line_walk), "--episodes", "1", env={"PYTHONPATH": str(USERLAND)})
    assert plays.returncode == 0 and len(_episode_rows(plays.stdout)) == 1, plays.stderr


def test_self_play_runs_are_refused_by_name(tmp_path: Path):
    run_dir = tmp_path / "league"
    run_dir.mkdir()
    shutil.copy(REPO / "configs" / "tictactoe-selfplay.yaml", run_dir / "config.yaml")
    for command in ("play", "serve-policy"):
        done = _cli(command, str(run_dir))
        assert done.returncode == 2 and "is a self-play run" in done.stderr, done.stderr
        assert "rlfleet battle" in done.stderr


# -- rlfleet serve-policy, as a process ---------------------------------------------------------

@pytest.fixture(scope="module")
def served(trained_run: Path, tmp_path_factory: pytest.TempPathFactory):
    procs = Processes(tmp_path_factory.mktemp("served"))
    procs.env.update({TOKEN_ENV: TOKEN, "RLFLEET_MAX_BODY_BYTES": str(MAX_BODY)})
    procs.env.pop(TOKEN_FILE_ENV, None)
    service = procs.start("policy", "serve-policy", str(trained_run), port=free_port())
    try:
        service.wait_healthy(timeout=90)
        yield service
    finally:
        procs.stop_all()
        wait_for(lambda: not procs.leftovers(), 15, "the policy server to exit")


def _act(url: str, body, headers: dict | None = None) -> requests.Response:
    headers = {**AUTH, **(headers or {})}
    if isinstance(body, (bytes, str)):
        return requests.post(f"{url}/act", data=body, timeout=10,
                             headers={"Content-Type": "application/json", **headers})
    return requests.post(f"{url}/act", json=body, headers=headers, timeout=10)


def test_serve_policy_answers_batches_with_the_policys_actions(served, trained_run: Path):
    policy, version = _policy_of(trained_run)
    info = requests.get(f"{served.url}/info", headers=AUTH, timeout=5).json()
    assert info["env_id"] == "CartPole-v1" and info["algo"] == "ppo"
    assert info["obs_shape"] == [4] and info["obs_dtype"] == "float32"
    assert info["action_space"]["kind"] == "discrete" and info["action_space"]["n"] == 2
    assert info["policy_version"] == version and info["max_batch"] == 4096

    obs = observations("CartPole-v1", 64).astype(np.float32)
    for batch in (obs[:1], obs):
        resp = _act(served.url, {"obs": batch.tolist()})
        assert resp.status_code == 200, resp.text
        body = resp.json()
        assert body["policy_version"] == version
        assert body["actions"] == policy.act_eval(batch, True).tolist()
    # as collectors act: sampled, one valid action per observation
    resp = _act(served.url, {"obs": obs.tolist(), "deterministic": False})
    assert resp.status_code == 200
    actions = resp.json()["actions"]
    assert len(actions) == 64 and set(actions) <= {0, 1}
    # integers are numbers too
    assert _act(served.url, {"obs": [[0, 0, 0, 0]]}).status_code == 200


ROW = [0.01, -0.02, 0.03, 0.04]
BAD_BODIES = {
    "one observation, unbatched": ({"obs": ROW}, "obs", "batch of one"),
    "wrong width": ({"obs": [[0.1, 0.2, 0.3]]}, "obs", "expected a batch of shape (n, 4)"),
    "one level too deep": ({"obs": [[ROW]]}, "obs", "got shape (1, 1, 4)"),
    "ragged rows": ({"obs": [ROW, [0.1, 0.2]]}, "obs", "not a rectangular array"),
    "nested wrong": ({"obs": [ROW, [0.1, [0.2], 0.3, 0.4]]}, "obs", "not a rectangular"),
    "a string": ({"obs": [ROW, [0.1, 0.2, "0.3", 0.4]]}, "obs.1.2", "is not a number"),
    "all strings": ({"obs": [["a", "b", "c", "d"]]}, "obs.0.0", "is not a number"),
    "a boolean": ({"obs": [[0.1, True, 0.3, 0.4]]}, "obs.0.1", "is not a number"),
    "a null": ({"obs": [[0.1, 0.2, None, 0.4]]}, "obs.0.2", "is not a number"),
    "an object": ({"obs": [[0.1, 0.2, 0.3, {"x": 1}]]}, "obs.0.3", "is not a number"),
    "NaN": ('{"obs": [[0.1, 0.2, 0.3, 0.4], [0.1, NaN, 0.3, 0.4]]}', "obs.1.1", "not finite"),
    "Infinity": ('{"obs": [[0.1, 0.2, 0.3, -Infinity]]}', "obs.0.3", "not finite"),
    "beyond float32": ({"obs": [[0.1, 0.2, 0.3, 1e300]]}, "obs.0.3", "float32's range"),
    "an empty batch": ({"obs": []}, "obs", "at least 1 item"),
    "too many rows": ({"obs": [ROW] * 4097}, "obs", "at most 4096 items"),
    "no obs": ({"deterministic": True}, "obs", "Field required"),
    "obs not a list": ({"obs": "0.1 0.2"}, "obs", "valid array"),
    "an unknown field": ({"obs": [ROW], "temperature": 0.5}, "temperature", "Extra inputs"),
    "deterministic not a boolean": ({"obs": [ROW], "deterministic": "yes"}, "deterministic",
                                    "valid boolean"),
    "not JSON": ("obs=1,2,3,4", None, "not valid JSON"),
    "a JSON array": ("[[0.1, 0.2, 0.3, 0.4]]", None, "should be an object"),
}


@pytest.mark.parametrize("case", list(BAD_BODIES))
def test_serve_policy_refuses_a_bad_body_naming_the_field(served, case: str):
    body, field, words = BAD_BODIES[case]
    resp = _act(served.url, body)
    assert resp.status_code == 400 and resp.headers["Content-Type"] == "application/json"
    answer = resp.json()
    assert answer["field"] == field and words in answer["error"], answer


def test_serve_policy_guards_size_token_and_media_type(served):
    too_large = _act(served.url, {"obs": [[0.123456789] * 4] * 30_000})  # about 1.6 MB
    assert too_large.status_code == 413 and str(MAX_BODY) in too_large.json()["error"]
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        resp = requests.post(f"{served.url}/act", json={"obs": [ROW]}, headers=headers,
                             timeout=5)
        assert resp.status_code == 401 and resp.json()["field"] == "Authorization"
    assert requests.get(f"{served.url}/info", timeout=5).status_code == 401
    assert requests.get(f"{served.url}/openapi.json", timeout=5).status_code == 401
    assert requests.get(f"{served.url}/health", timeout=5).json() == {
        "ok": True, "role": "policy-server"}  # probes need no token
    text = _act(served.url, json.dumps({"obs": [ROW]}), {"Content-Type": "text/plain"})
    assert text.status_code == 400 and "application/json" in text.json()["error"]


def test_serve_policy_openapi_document_is_valid(served):
    from openapi_spec_validator import validate

    doc = requests.get(f"{served.url}/openapi.json", headers=AUTH, timeout=10).json()
    validate(doc)
    assert doc["info"]["title"] == "rlfleet policy server"
    assert set(doc["paths"]) == {"/act", "/info", "/health"}
    act = doc["paths"]["/act"]["post"]
    assert act["requestBody"]["required"] is True
    assert {"200", "400", "401", "413"} <= set(act["responses"])
    assert act["responses"]["401"]["headers"]["WWW-Authenticate"]
    schema = doc["components"]["schemas"]["ActRequest"]["properties"]["obs"]
    assert schema["minItems"] == 1 and schema["maxItems"] == 4096
    assert doc["paths"]["/health"]["get"]["security"] == []


def test_serve_policy_stops_cleanly_on_sigterm(served):
    """The last test of the module's server: SIGTERM ends it with exit code 0."""
    assert served.stop() == 0
    assert "Traceback" not in served.log_path.read_text()


# -- other policies, served in-process -----------------------------------------------------------

def _client(run_dir: Path, monkeypatch: pytest.MonkeyPatch):
    from rlfleet.policy_server import PolicyService, create_app

    monkeypatch.delenv(TOKEN_ENV, raising=False)
    monkeypatch.delenv(TOKEN_FILE_ENV, raising=False)
    service = PolicyService(run_dir)
    return service, create_app(service).test_client()


def _bc(env_id: str) -> dict:
    data = _config("cartpole-dqn.yaml", env={"id": env_id})
    data["algo"] = {"name": "bc", "hidden_sizes": [32]}
    return data


KINDS = {  # (config, env id)
    "dqn": (_config("cartpole-dqn.yaml"), "CartPole-v1"),
    "bc": (_bc("CartPole-v1"), "CartPole-v1"),
    "bc-continuous": (_bc("Pendulum-v1"), "Pendulum-v1"),
    "ppo-continuous-obs-norm": (_config("pendulum-ppo.yaml", algo={"obs_norm": True}),
                                "Pendulum-v1"),
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_serve_policy_acts_for_each_kind_of_policy(kind: str, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch):
    import gymnasium as gym

    data, env_id = KINDS[kind]
    run_dir = _untrained_run(tmp_path, kind, data)
    _, client = _client(run_dir, monkeypatch)
    policy, version = _policy_of(run_dir)
    space = gym.make(env_id).action_space
    obs = observations(env_id, 32).astype(np.float32)
    pre = getattr(policy, "preprocess", lambda o: o)
    greedy = np.asarray(policy.act_eval(pre(obs), True))
    resp = client.post("/act", json={"obs": obs.tolist()})
    assert resp.status_code == 200, resp.json
    actions = np.asarray(resp.json["actions"])
    assert resp.json["policy_version"] == version == 7 and len(actions) == 32
    info = client.get("/info").json["action_space"]
    if isinstance(space, gym.spaces.Discrete):
        assert actions.tolist() == greedy.tolist()
        assert info == {"kind": "discrete", "n": int(space.n), "shape": None, "low": None,
                        "high": None}
    else:  # clipped to the action space, as the run's envs clip them
        assert actions.shape == (32, *space.shape)
        assert np.allclose(actions, np.clip(greedy, space.low, space.high), atol=1e-5)
        assert info == {"kind": "box", "n": None, "shape": list(space.shape),
                        "low": space.low.tolist(), "high": space.high.tolist()}
    if kind.endswith("obs-norm"):  # observations normalised as the policy's version says
        assert not np.allclose(np.asarray(policy.act_eval(obs, True)), greedy)
    sampled = client.post("/act", json={"obs": obs.tolist(), "deterministic": False})
    assert sampled.status_code == 200
    assert all(space.contains(np.asarray(a, dtype=space.dtype))
               for a in sampled.json["actions"])


def test_serve_policy_takes_uint8_frames(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """An Atari policy (Nature CNN) reads stacks of uint8 frames: integers 0-255."""
    pytest.importorskip("ale_py", reason="the atari extra: pip install -e '.[atari]'")
    run_dir = _untrained_run(tmp_path, "breakout", _config("breakout-ppo.yaml",
                                                           env={"num_envs": 1}))
    service, client = _client(run_dir, monkeypatch)
    info = client.get("/info").json
    assert info["obs_shape"] == [4, 84, 84] and info["obs_dtype"] == "uint8"
    n = info["action_space"]["n"]
    frames = np.random.default_rng(0).integers(0, 256, size=(3, 4, 84, 84), dtype=np.uint8)
    resp = client.post("/act", json={"obs": frames.tolist()})
    assert resp.status_code == 200, resp.json
    policy, _ = _policy_of(run_dir)
    assert resp.json["actions"] == policy.act_eval(frames, True).tolist()
    assert all(0 <= a < n for a in resp.json["actions"])
    for value, words in ((256, "outside uint8's range 0..255"), (-1, "outside uint8"),
                         (3.5, "not an integer")):
        bad = frames[:1].tolist()
        bad[0][1][2][3] = value
        resp = client.post("/act", json={"obs": bad})
        assert resp.status_code == 400 and resp.json["field"] == "obs.0.1.2.3", resp.json
        assert words in resp.json["error"]
    whole = frames[:1].astype(np.float64).tolist()  # 7.0 is the integer 7
    assert client.post("/act", json={"obs": whole}).status_code == 200


# -- success rates in `rlfleet play` ------------------------------------------------------------

def test_play_reports_the_success_rate_of_envs_that_say(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture):
    """Bit flipping sets `info["is_success"]`: play counts it per episode (an episode
    succeeds exactly when it returns more than -n_bits) and prints the rate; CartPole says
    nothing, and play prints no rate rather than 0."""
    from rlfleet.play import play_run, print_played

    bits = 3
    bitflip = _untrained_run(tmp_path, "bitflip", _config(
        "bitflip-her.yaml", env={"kwargs": {"n_bits": bits}, "num_envs": 2}))
    played = play_run(bitflip, episodes=6)
    assert len(played.successes) == 6 and all(isinstance(s, bool) for s in played.successes)
    assert played.successes == [r > -bits for r in played.returns]
    assert played.success_rate == pytest.approx(np.mean(played.successes))
    print_played(played)
    out = capsys.readouterr().out
    assert f"success rate: {played.success_rate:.2f} ({sum(played.successes)} of 6" in out
    assert "┃ success ┃" in out  # a column, each episode's yes or no

    cartpole = _untrained_run(tmp_path, "cartpole", _config("cartpole-dqn.yaml"))
    played = play_run(cartpole, episodes=2)
    assert played.successes == [None, None] and played.success_rate is None
    print_played(played)
    out = capsys.readouterr().out
    table = out.split("\n", 1)[1]  # below the first line, which names the run dir
    assert "success" not in table and len(_episode_rows(out)) == 2


# -- serve-policy follows a run's newer best policy ---------------------------------------------

def _write_best(run_dir: Path, seed: int, version: int):
    """A new best policy in the run dir, written as the coordinator writes it (a temporary
    file renamed over the old one); returns it, loaded for comparison."""
    from rlfleet.shared.algos.registry import make_policy
    from rlfleet.shared.contract.codec import encode_weights
    from rlfleet.shared.envs.make import run_spec
    from rlfleet.shared.run.config import load_config

    cfg = load_config(run_dir / "config.yaml")
    policy = make_policy(cfg.algo, run_spec(cfg), seed)
    policy.load_policy(version, policy.policy_state())
    tmp = run_dir / "best_policy.safetensors.tmp"
    tmp.write_bytes(encode_weights(policy.policy_state(), {"policy_version": str(version)}))
    tmp.replace(run_dir / "best_policy.safetensors")
    return policy


def test_serve_policy_swaps_in_a_newer_best_policy_and_rides_out_a_broken_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture):
    """Over real HTTP: every answer names the version that chose its actions, and its
    actions are that version's greedy ones (a request never acts with half-loaded weights),
    while another thread keeps asking throughout. A truncated file keeps the served policy,
    with one warning however many checks see it; a good file after it is served again."""
    import logging
    import threading

    from rlfleet.policy_server import PolicyService, create_app
    from rlfleet.serve import InProcessServer
    from rlfleet.shared.contract.config import ConfigError

    monkeypatch.delenv(TOKEN_ENV, raising=False)
    monkeypatch.delenv(TOKEN_FILE_ENV, raising=False)
    run_dir = _untrained_run(tmp_path, "training", _config("cartpole-dqn.yaml"), version=7)
    with pytest.raises(ConfigError, match="--reload-s=-1"):
        PolicyService(run_dir, reload_s=-1)
    policies = {7: _policy_of(run_dir)[0]}
    obs = observations("CartPole-v1", 16).astype(np.float32)
    greedy = {}

    def expected(version: int) -> list:
        if version not in greedy:
            greedy[version] = policies[version].act_eval(obs, True).tolist()
        return greedy[version]

    service = PolicyService(run_dir, reload_s=0.1)
    server = InProcessServer(create_app(service), "127.0.0.1", free_port(), threads=2).listen()
    url = f"http://127.0.0.1:{server.port}"
    runner = threading.Thread(target=server.run, kwargs={"install_signals": False})
    runner.start()
    stop, seen, wrong = threading.Event(), set(), []

    def hammer() -> None:
        with requests.Session() as s:
            while not stop.is_set():
                body = s.post(f"{url}/act", json={"obs": obs.tolist()}, timeout=5).json()
                seen.add(body["policy_version"])
                if body["actions"] != expected(body["policy_version"]):
                    wrong.append(body)

    def version() -> int:
        return requests.post(f"{url}/act", json={"obs": obs[:1].tolist()},
                             timeout=5).json()["policy_version"]

    caplog.set_level(logging.INFO, logger="rlfleet.policy_server")
    asking = threading.Thread(target=hammer)
    try:
        wait_for(lambda: version() == 7, 10, "the first policy")
        asking.start()
        policies[9] = _write_best(run_dir, seed=9, version=9)
        wait_for(lambda: version() == 9, 10, "version 9 to be served")
        assert requests.get(f"{url}/info", timeout=5).json()["policy_version"] == 9
        good = (run_dir / "best_policy.safetensors").read_bytes()
        half = run_dir / "half.tmp"  # renamed in whole: one broken version of the file
        half.write_bytes(good[:len(good) // 2])
        half.replace(run_dir / "best_policy.safetensors")
        wait_for(lambda: "was not loaded" in caplog.text, 10, "a warning about the file")
        swaps = caplog.text.count("now serving")
        checks = service.checks
        wait_for(lambda: service.checks >= checks + 10, 10,
                 "ten more checks of the same broken file")
        assert version() == 9 and caplog.text.count("was not loaded") == 1
        assert caplog.text.count("now serving") == swaps
        policies[12] = _write_best(run_dir, seed=12, version=12)
        wait_for(lambda: version() == 12, 10, "version 12 to be served")
    finally:
        stop.set()
        if asking.is_alive():
            asking.join(timeout=10)
        server.request_stop()
        runner.join(timeout=30)
    assert not wrong, wrong[:1]
    assert {7, 9} <= seen <= {7, 9, 12}
    assert not runner.is_alive()
