"""`rlfleet serve-policy RUN_DIR --port P`: a run's trained policy answering HTTP requests.

The policy is the run's result (`best_policy.safetensors`), loaded as `rlfleet play` loads it
(`services/play.py`), and it acts as evaluations act it unless a request asks otherwise.
`--checkpoint N` serves the policy of the run's checkpoint at train iteration N instead
(`rlfleet checkpoints RUN_DIR` lists them); a checkpoint never changes, so it is never
reloaded.

Pointed at a run that is still training, the server follows its best policy: every
`--reload-s` seconds (default 5; 0: never) a thread of its own looks at the file's size and
modification time, and when they changed it loads the new weights into a new policy object,
off the request path, then swaps it in with one reference assignment. A request acts with
the policy it picked up as it began, so it never sees half-loaded weights, and its answer
names that policy's version. A file that is mid-write (it changed while being read),
truncated or otherwise not a policy of this run leaves the old policy serving, with one
warning per version of the file, and is tried again at the next check.

- `POST /act` `{"obs": [[...], ...], "deterministic": true}`: a batch of 1 to `MAX_BATCH`
  raw observations (as the env returns them: the policy normalises them itself where the run
  used `algo.obs_norm`), answered with `{"actions": [...], "policy_version": V}`, one action
  per observation, from one forward pass. A single observation is sent as a batch of one:
  `[obs]` (an unbatched one is refused, with that hint, rather than guessed at: an
  observation of shape (n, k) and a batch of n observations of shape (k,) look alike).
  `deterministic: false` acts as collectors do (DQN: epsilon at its final value; PPO: sampled).
  Discrete actions are integers; continuous ones are lists, clipped to the action space as
  the run's envs clip them.
- `GET /info`: the run, env id, observation shape and dtype, action space, algorithm, the
  policy version being served, the batch limit and the reload interval. `GET /health`:
  liveness, open without the token. `GET /openapi.json`: this API as OpenAPI 3.1 (the
  coordinator's generator, `coordinator/openapi.py`, over these routes).

Every 4xx is JSON `{"error", "field"}` (`shared/infra/webapp.py`): 400 naming `obs` for a wrong
shape (the message says the expected one), an empty batch or more than `MAX_BATCH` rows;
naming the element (`obs.3.1`) for one that is not a number, NaN or infinite, or out of the
observation dtype's range (uint8 images: integers 0-255); naming an unknown field; `field`
null for a body that is not a JSON object. 413 for a body over `RLFLEET_MAX_BODY_BYTES`; 401
(`Authorization`) without the cluster's token when one is set (`shared/infra/auth.py`).

Served by `services/serve.py`'s in-process cheroot pool (`--threads`); inference is one
torch thread and one forward pass at a time (a lock: the policies' samplers are not
thread-safe), so throughput comes from batching. SIGTERM or Ctrl-C stops it cleanly.
Self-play runs are refused (their policies act on masked moves; `rlfleet battle` plays them).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from pydantic import Field

from rlfleet.export import BEST_POLICY_FILE, policy_from_blob
from rlfleet.play import policy_actions, trained_policy
from rlfleet.shared.contract.config import ConfigError
from rlfleet.shared.contract.wire.base import Request, Response
from rlfleet.shared.contract.wire.views import Health
from rlfleet.shared.infra.webapp import BadRequest

if TYPE_CHECKING:
    from flask import Flask

    from rlfleet.shared.algos.base import Policy

log = logging.getLogger("rlfleet.policy_server")

MAX_BATCH = 4096  # observations a request
DEFAULT_RELOAD_S = 5.0  # seconds between looks at the run's best policy
_NUMBERS = {int, float}  # what JSON numbers parse to (never bool: `true` is not a number)


class ActRequest(Request):
    obs: list[Any] = Field(min_length=1, max_length=MAX_BATCH, description=(
        f"a batch of 1 to {MAX_BATCH} raw observations, each of the shape and dtype "
        "`GET /info` names (nested lists of numbers); one observation is a batch of one"))
    deterministic: bool = Field(True, strict=True, description=(
        "act as evaluations do (greedy, or the Gaussian's mean); false: as collectors do "
        "(sampled, or epsilon-greedy at the final epsilon)"))


class ActResponse(Response):
    actions: list[Any] = Field(description="one action per observation: an integer "
                               "(discrete spaces) or a list of numbers (continuous ones)")
    policy_version: int = Field(description="the version of the policy that chose these "
                                "actions (a newer best policy may be served by the next "
                                "request)")


class ActionSpace(Response):
    kind: Literal["discrete", "box"]
    n: int | None = Field(None, description="discrete: the number of actions")
    shape: list[int] | None = Field(None, description="box: the shape of one action")
    low: list[float | None] | None = Field(None, description="box: lower bounds, flattened "
                                           "(null: unbounded)")
    high: list[float | None] | None = Field(None, description="box: upper bounds, flattened "
                                            "(null: unbounded)")


class PolicyInfo(Response):
    run: str
    env_id: str
    algo: str
    policy_version: int
    obs_shape: list[int]
    obs_dtype: str
    action_space: ActionSpace
    max_batch: int
    reload_s: float = Field(description="seconds between checks for a newer best policy in "
                            "the run directory; 0: the policy loaded at start is kept")


FileStamp = tuple[int, int]  # (size, mtime in ns): a file that changed has another
_MISSING: FileStamp = (-1, -1)  # the stamp of a file that could not be looked at


@dataclass(frozen=True)
class ServedPolicy:
    """The policy requests act with, and what it was loaded from; replaced whole, never
    changed, so a request that picked one up keeps a consistent policy and version."""

    policy: Policy
    version: int
    stamp: FileStamp | None


class PolicyService:
    """The served policy and what requests are checked against. It owns one thread, the
    reloader (`start` and `close` are what `services/serve.py` calls around serving)."""

    role = "policy-server"

    def __init__(self, run_dir: Path, reload_s: float = DEFAULT_RELOAD_S,
                 checkpoint: int | None = None) -> None:
        import gymnasium as gym

        from rlfleet.shared.envs.make import make_vector_env

        if not reload_s >= 0:  # also NaN
            raise ConfigError(f"--reload-s={reload_s}: seconds between checks for a newer "
                              "best policy, 0 or more (0: never)")
        self.run_dir = run_dir
        self.checkpoint = checkpoint
        self.reload_s = reload_s if checkpoint is None else 0.0  # a checkpoint never changes
        self.best_path = run_dir / BEST_POLICY_FILE
        # stamped before it is read: a change meanwhile is loaded at the first check
        stamp = _stamp(self.best_path)
        self.cfg, policy, version = trained_policy(run_dir, checkpoint=checkpoint)
        from rlfleet.shared.algos.capabilities import Recurrent

        if isinstance(policy, Recurrent):
            raise ConfigError(f"algo.name={self.cfg.algo.name!r}: a recurrent policy acts "
                              "from its memory of each episode, and /act requests are "
                              "stateless (no episode to remember): `rlfleet serve` serves "
                              "feed-forward policies only; `rlfleet play` plays this one")
        self.served = ServedPolicy(policy, version, stamp)
        envs = make_vector_env(self.cfg.env, 1, self.cfg.seed)
        try:
            self.obs_space = envs.single_observation_space
            # the env's own bounds: the vector env's ClipAction wrapper announces (-inf, inf)
            action_space = envs.unwrapped.single_action_space
        finally:
            envs.close()
        # what a trained policy's env has (EnvSpec): arrays of a fixed shape in, one of
        # these action spaces out
        assert self.obs_space.shape is not None
        assert isinstance(action_space, gym.spaces.Discrete | gym.spaces.Box), action_space
        self.action_space = action_space
        self.obs_shape = tuple(int(d) for d in self.obs_space.shape)
        self.obs_dtype = np.dtype(self.obs_space.dtype)
        self.discrete = isinstance(self.action_space, gym.spaces.Discrete)
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._reloader: threading.Thread | None = None
        self._warned: FileStamp | None = None  # the file version a warning was logged for
        self.checks = 0  # looks the reloader took at the file (a test waits on it)
        self.on_fatal = None  # set by services/serve.py; nothing here can fail fatally

    @property
    def version(self) -> int:
        return self.served.version

    def start(self) -> PolicyService:
        log.info("serving %s: %s policy version %d%s on %s, obs %s %s%s", self.run_dir,
                 self.cfg.algo.name, self.version,
                 "" if self.checkpoint is None
                 else f" (checkpoint at train iteration {self.checkpoint})",
                 self.cfg.env.id, self.obs_shape,
                 self.obs_dtype, f"; a newer best policy is looked for every {self.reload_s:g} s"
                 if self.reload_s else "")
        if self.reload_s > 0:
            self._reloader = threading.Thread(target=self._watch, name="policy-reload",
                                              daemon=True)
            self._reloader.start()
        return self

    def close(self) -> None:
        """Stop the reloader; the policy itself lives as long as the process."""
        self._closing.set()
        if self._reloader is not None:
            self._reloader.join(timeout=30)

    def _watch(self) -> None:
        while not self._closing.wait(self.reload_s):
            self.reload_if_changed()
            self.checks += 1

    def reload_if_changed(self) -> bool:
        """Swap in the run's best policy if its file changed since the served one was read;
        True when a new policy now serves. Any trouble keeps the old one (see the module's
        docstring); the reloader calls this, and nothing on the request path does."""
        stamp = _stamp(self.best_path)
        if stamp is None:  # gone for a moment (a run dir being copied over, say)
            self._warn_once(_MISSING, "it cannot be looked at")
            return False
        if stamp == self.served.stamp:
            return False
        try:
            blob = self.best_path.read_bytes()
            if _stamp(self.best_path) != stamp:  # still being written: next time
                return False
            policy, version = policy_from_blob(self.cfg, blob)
        # Whatever a bad file makes decoding or the policy raise (a user's policy class
        # included), serving goes on with the policy it has.
        except Exception as err:
            self._warn_once(stamp, f"{type(err).__name__}: {err}")
            return False
        old, self.served = self.served, ServedPolicy(policy, version, stamp)
        self._warned = None
        log.info("now serving policy version %d (was %d) from %s", version, old.version,
                 self.best_path)
        return True

    def _warn_once(self, stamp: FileStamp, why: str) -> None:
        """One warning per version of the file, not one every `reload_s` seconds."""
        if self._warned == stamp:
            return
        self._warned = stamp
        log.warning("%s was not loaded (%s); still serving policy version %d, trying "
                    "again in %g s", self.best_path, why, self.version, self.reload_s)

    def info(self) -> PolicyInfo:
        import gymnasium as gym

        space = self.action_space
        if isinstance(space, gym.spaces.Discrete):
            action = ActionSpace(kind="discrete", n=int(space.n))
        else:
            action = ActionSpace(kind="box", shape=list(space.shape),
                                 low=_bounds(space.low), high=_bounds(space.high))
        return PolicyInfo(run=str(self.run_dir), env_id=self.cfg.env.id,
                          algo=self.cfg.algo.name, policy_version=self.version,
                          obs_shape=list(self.obs_shape), obs_dtype=self.obs_dtype.name,
                          action_space=action, max_batch=MAX_BATCH, reload_s=self.reload_s)

    def observations(self, obs: list[Any]) -> np.ndarray:
        """The request's observations as one array of the env's dtype, or a `BadRequest`
        naming what is wrong and where."""
        expected = f"({', '.join(['n', *map(str, self.obs_shape)])}) of {self.obs_dtype.name}"
        try:
            arr = np.asarray(obs)
        except (ValueError, OverflowError):  # ragged nesting
            raise BadRequest(f"obs: not a rectangular array: expected a batch of shape "
                             f"{expected}", "obs") from None
        if arr.shape[1:] != self.obs_shape or arr.ndim != len(self.obs_shape) + 1:
            hint = (": one observation is sent as a batch of one, [obs]"
                    if arr.shape == self.obs_shape else "")
            raise BadRequest(f"obs: expected a batch of shape {expected}, got shape "
                             f"{tuple(arr.shape)}{hint}", "obs")
        # numpy reads `true` as 1 beside numbers, and "1.5" as a string: look at each
        # element's JSON type (one pass at C speed over the flattened, rectangular batch)
        flat: Any = obs
        for _ in range(arr.ndim - 1):
            flat = chain.from_iterable(flat)
        if not set(map(type, flat)) <= _NUMBERS or arr.dtype.kind not in "iuf":
            where, value = _first_non_number(obs)
            raise BadRequest(f"{where}: {value!r} is not a number: expected a batch of shape "
                             f"{expected}", where)
        if arr.dtype.kind == "f":
            bad = ~np.isfinite(arr)
            if bad.any():
                raise _at(arr, bad, "is not finite")
        if self.obs_dtype.kind in "iu":
            limits = np.iinfo(self.obs_dtype)
            if arr.dtype.kind == "f":
                fractional = arr != np.floor(arr)
                if fractional.any():
                    raise _at(arr, fractional, f"is not an integer ({self.obs_dtype.name} "
                              "observations)")
            outside = (arr < limits.min) | (arr > limits.max)
            if outside.any():
                raise _at(arr, outside, f"is outside {self.obs_dtype.name}'s range "
                          f"{limits.min}..{limits.max}")
            return arr.astype(self.obs_dtype)
        if self.obs_dtype.kind == "f":
            overflow = np.abs(arr) > np.finfo(self.obs_dtype).max
            if overflow.any():
                raise _at(arr, overflow, f"is outside {self.obs_dtype.name}'s range")
        return arr.astype(self.obs_dtype)

    def act(self, obs: np.ndarray, deterministic: bool) -> tuple[np.ndarray, int]:
        """The actions for a batch and the version of the policy that chose them: the one
        served as the request began, whatever the reloader swaps in meanwhile."""
        import gymnasium as gym

        served = self.served
        with self._lock:  # one forward pass at a time: samplers hold state
            actions = policy_actions(served.policy, obs, deterministic)
        # a Box's actions clipped, as the run's envs clip them (shared/envs/make.py: ClipAction)
        if isinstance(self.action_space, gym.spaces.Box):
            actions = np.clip(actions, self.action_space.low, self.action_space.high)
        return actions, served.version


def _stamp(path: Path) -> FileStamp | None:
    """The file's size and modification time; None when it cannot be looked at."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns


def _bounds(values: np.ndarray) -> list[float | None]:
    return [float(v) if np.isfinite(v) else None for v in values.ravel()]


def _first_non_number(obs: list[Any], where: str = "obs") -> tuple[str, Any]:
    """The dotted path and value of the first element that is not a number (bools, strings,
    null, objects, integers too large for int64)."""
    for i, item in enumerate(obs):
        path = f"{where}.{i}"
        if isinstance(item, list):
            found = _first_non_number(item, path)
            if found[0] != path:
                return found
        elif isinstance(item, bool) or not isinstance(item, (int, float)) or (
                isinstance(item, int) and not -2**63 <= item < 2**63):
            return path, item
    return where, obs


def _at(arr: np.ndarray, bad: np.ndarray, what: str) -> BadRequest:
    """A 400 naming the first element where `bad` holds."""
    index = tuple(int(i) for i in np.argwhere(bad)[0])
    where = ".".join(["obs", *map(str, index)])
    return BadRequest(f"{where}: {arr[index].item()!r} {what}", where)


def create_app(service: PolicyService) -> Flask:
    """The policy server's Flask app (the pytest client serves the very same one)."""
    from flask import Flask, current_app, jsonify

    from rlfleet.coordinator.openapi import document, openapi_document
    from rlfleet.shared.infra.auth import install_token_guard, load_token
    from rlfleet.shared.infra.webapp import install_error_handlers, parse_body

    app = Flask("rlfleet.policy_server")
    install_error_handlers(app)
    install_token_guard(app, load_token())
    app.extensions["rlfleet"] = service
    document_cache: list[dict] = []
    cache_lock = threading.Lock()

    def svc() -> PolicyService:
        return current_app.extensions["rlfleet"]

    @app.get("/health")
    @document(Health, public=True)
    def health():
        return jsonify({"ok": True, "role": PolicyService.role})

    @app.get("/info")
    @document(PolicyInfo)
    def info():
        return current_app.response_class(svc().info().model_dump_json(),
                                           mimetype="application/json")

    @app.post("/act")
    @document(ActResponse, body=ActRequest)
    def act():
        s = svc()
        req = parse_body(ActRequest)
        actions, version = s.act(s.observations(req.obs), req.deterministic)
        return jsonify({"actions": actions.tolist(), "policy_version": version})

    @app.get("/openapi.json")
    def openapi():
        """This API as an OpenAPI 3.1 document, generated once from the routes' models."""
        with cache_lock:
            if not document_cache:
                document_cache.append(openapi_document(
                    current_app, title="rlfleet policy server", description=(
                        "A run's trained policy (`rlfleet serve-policy`). Every error "
                        "answer is an `ErrorBody`.")))
        return jsonify(document_cache[0])

    return app


def serve_policy(run_dir: Path, host: str, port: int, threads: int = 4,
                 reload_s: float = DEFAULT_RELOAD_S, checkpoint: int | None = None) -> int:
    """Serve the run's policy until SIGTERM/SIGINT, following its newer best policies every
    `reload_s` seconds (with `checkpoint`: that checkpoint's policy, never reloaded); blocks
    and returns the exit code."""
    from rlfleet.serve import InProcessServer
    from rlfleet.shared.infra.auth import load_token
    from rlfleet.shared.infra.webapp import max_body_bytes

    load_token()  # a bad token or body-limit setting: exit 2 before the policy loads
    max_body_bytes()
    server = InProcessServer(create_app(PolicyService(run_dir, reload_s, checkpoint)), host,
                             port, threads)
    server.listen()
    log.info("listening on http://%s:%d (POST /act, GET /info, GET /openapi.json)", host,
             server.port)
    return server.run()
