"""The deployment files: services/Dockerfile, docker-compose.yml and deploy/k8s/.

No Docker engine, no cluster and no network: every file is parsed and checked against the
things it must agree with, the `rlfleet` CLI above all (every container command must parse with
`rlfleet.cli.build_parser()`, and every RLFLEET_* variable must be one the CLI reads).

docker-compose.yml is validated against the Compose Specification's JSON schema in
`data/compose-spec.json`: compose-spec's `schema/compose-spec.json` as vendored by PyPI's
docker-compose 1.29.2 (`compose/config/compose_spec.json`, sha256 0dc04bd3...2b112bac).
Where kubectl is installed, one more test runs `kubectl kustomize` on the files; elsewhere
it skips, saying so. `docker compose config` runs in tests/compose, with the suite's engine.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from rlfleet.cli import build_parser

from .helpers import REPO

COMPOSE_FILE = REPO / "docker-compose.yml"
DOCKERFILE = REPO / "services" / "Dockerfile"
K8S = REPO / "deploy" / "k8s"
SCHEMA = Path(__file__).parent / "data" / "compose-spec.json"

ROLES = {"coordinator": 8000, "learner": 8100, "collector": 8200}
# What the coordinator's container runs after `gunicorn`: `rlfleet coordinator` with its
# options from RLFLEET_* variables (services/wsgi.py).
GUNICORN_ARGS = ["-c", "python:rlfleet.gunicorn_conf", "rlfleet.wsgi:coordinator_app()"]
TOKEN_SECRET = "rlfleet-token"


# -- loading ------------------------------------------------------------------------------

def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE_FILE.read_text())


def kustomization() -> dict[str, Any]:
    return yaml.safe_load((K8S / "kustomization.yaml").read_text())


def k8s_docs(names: list[str] | None = None) -> list[dict[str, Any]]:
    files = names if names is not None else kustomization()["resources"] + ["collector-hpa.yaml"]
    docs = []
    for name in files:
        docs += [d for d in yaml.safe_load_all((K8S / name).read_text()) if d is not None]
    return docs


def k8s_object(kind: str, name: str) -> dict[str, Any]:
    found = [d for d in k8s_docs() if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name!r} in deploy/k8s, found {len(found)}"
    return found[0]


def k8s_container(role: str) -> dict[str, Any]:
    containers = k8s_object("Deployment", role)["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1, f"Deployment {role}: one container expected"
    return containers[0]


# -- what a container runs ----------------------------------------------------------------

def compose_argv(service: dict[str, Any]) -> list[str]:
    """The arguments after `rlfleet` that a compose service runs: the image's ENTRYPOINT
    (rlfleet) with `command`, or a `sh -c 'exec rlfleet ...'` wrapper. `$$` is compose's
    escape for a `$` that the container's shell sees."""
    command = service["command"]
    command = [c.replace("$$", "$") for c in command] if isinstance(command, list) \
        else command.replace("$$", "$")
    if service.get("entrypoint") == ["gunicorn"]:
        assert command == GUNICORN_ARGS, command
        return ["coordinator"]
    if service.get("entrypoint") is None:
        assert isinstance(command, list), "command: give it as a list (exec form)"
        return command
    assert service["entrypoint"] in (["/bin/sh", "-c"], ["sh", "-c"]), service["entrypoint"]
    script = command[0] if isinstance(command, list) else command
    words = shlex.split(script)
    assert words[:2] == ["exec", "rlfleet"], f"the wrapper must `exec rlfleet`: {script!r}"
    return words[2:]


def k8s_argv(container: dict[str, Any]) -> list[str]:
    if container.get("command") == ["gunicorn"]:
        assert container["args"] == GUNICORN_ARGS, container["args"]
        return ["coordinator"]
    assert "command" not in container, "keep the image's ENTRYPOINT (rlfleet); use args"
    return container["args"]


def compose_env(service: dict[str, Any]) -> dict[str, str]:
    """The service's environment with `${VAR:?msg}` / `${VAR:-default}` interpolated as
    compose would (a required variable gets a stand-in value)."""
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)

    def interpolate(value: str) -> str:
        return re.sub(r"\$\{(\w+)(?::-([^}]*)|:\?[^}]*)?\}",
                      lambda m: m.group(2) if m.group(2) is not None else f"<{m.group(1)}>",
                      str(value))

    return {name: interpolate(value) for name, value in env.items()}


def k8s_env(container: dict[str, Any]) -> dict[str, str]:
    """The container's environment as the kubelet makes it: valueFrom gets a stand-in value,
    and `$(NAME)` refers to a variable defined earlier in the list."""
    env: dict[str, str] = {}
    for item in container.get("env", []):
        if "valueFrom" in item:
            value = f"<{item['name']}>" if item["name"] != "POD_IP" else "10.1.2.3"
        else:
            value = re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)),
                           str(item["value"]))
        env[item["name"]] = value
    return env


def parse(argv: list[str], env: dict[str, str], monkeypatch: pytest.MonkeyPatch):
    """`rlfleet ARGV` parsed by the real CLI, with the container's RLFLEET_* variables in
    place of this process's (the parser reads them as defaults)."""
    with monkeypatch.context() as m:
        for name in [n for n in os.environ if n.startswith("RLFLEET_")]:
            m.delenv(name)
        for name, value in env.items():
            m.setenv(name, value)
        try:
            return build_parser().parse_args(argv)
        except SystemExit:
            pytest.fail(f"`rlfleet {shlex.join(argv)}` does not parse with services/cli.py")


def settings(argv: list[str], env: dict[str, str]) -> set[str]:
    """RLFLEET_* names a container sets, by variable or by option (`--run-dir` counts as
    RLFLEET_RUN_DIR), so compose and k8s may choose differently and still be compared."""
    options = {"RLFLEET_" + a[2:].split("=")[0].upper().replace("-", "_")
               for a in argv if a.startswith("--")}
    return {n for n in env if n.startswith("RLFLEET_")} | options


def cli_env_names() -> set[str]:
    """The RLFLEET_* variables rlfleet reads: the options of its commands (every module of
    services/ that defines some: the CLI's, the roles', the logging every command sets up),
    plus the token and body limit, which the services read themselves (shared/infra/auth.py,
    shared/infra/webapp.py), and the variables every command reads by name (services/command.py:
    the log level, the coordinator's overrides)."""
    names: set[str] = set()
    for path in sorted((REPO / "services").rglob("*.py")):
        names |= {f"RLFLEET_{name}"
                  for name in re.findall(r'\benv\("([A-Z_]+)"', path.read_text())}
    for path in (REPO / "shared" / "infra" / "auth.py", REPO / "shared" / "infra" / "webapp.py",
                 REPO / "services" / "command.py"):
        names |= set(re.findall(r'"(RLFLEET_[A-Z_]+)"', path.read_text()))
    return names


def health_url_port(healthcheck: dict[str, Any]) -> int:
    test = " ".join(healthcheck["test"]) if isinstance(healthcheck["test"], list) \
        else healthcheck["test"]
    m = re.search(r"http://(?:localhost|127\.0\.0\.1):(\d+)/health\b", test)
    assert m, f"healthcheck does not GET /health: {test!r}"
    return int(m.group(1))


# -- docker-compose.yml -------------------------------------------------------------------

def test_compose_file_matches_the_compose_spec_schema():
    schema = json.loads(SCHEMA.read_text())
    validator = jsonschema.Draft201909Validator(schema)
    errors = sorted(validator.iter_errors(compose()), key=lambda e: list(e.absolute_path))
    assert not errors, "\n".join(f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: "
                                 f"{e.message}" for e in errors)


def test_the_schema_catches_a_misspelt_key():
    """The vendored schema is strict: an unknown service key is an error, not ignored."""
    doc = compose()
    doc["services"]["collector"]["stop_grace_periodd"] = "30s"
    validator = jsonschema.Draft201909Validator(json.loads(SCHEMA.read_text()))
    assert any("stop_grace_periodd" in e.message for e in validator.iter_errors(doc))


def test_compose_services_and_health_checks():
    services = compose()["services"]
    assert set(services) == {"redis", "scaler", *ROLES}
    assert services["redis"]["image"].startswith("redis:7")
    assert "redis-cli" in services["redis"]["healthcheck"]["test"]
    for role, port in ROLES.items():
        service = services[role]
        assert service["build"] == {"context": ".", "dockerfile": "services/Dockerfile"}
        assert health_url_port(service["healthcheck"]) == port, role
        assert compose_argv(service)[0] == role
    deps = {name: s.get("depends_on", {}) for name, s in services.items()}
    assert deps["coordinator"] == {"redis": {"condition": "service_healthy"}}
    for worker in ("learner", "collector"):
        assert deps[worker] == {"coordinator": {"condition": "service_healthy"}}
    assert services["coordinator"]["ports"] == ["${RLFLEET_PORT:-8000}:8000"]


def test_compose_scaler_is_an_opt_in_privilege():
    """The Docker socket is root on the host: the scaler runs only when its profile is
    asked for, and is the only service that mounts it."""
    services = compose()["services"]
    scaler = services["scaler"]
    assert scaler["profiles"] == ["scaler"]
    assert compose_argv(scaler)[0] == "scaler"
    assert any(v.endswith(":/var/run/docker.sock") for v in scaler["volumes"])
    for name, service in services.items():
        if name != "scaler":
            assert "profiles" not in service, name
            assert not any("docker.sock" in str(v) for v in service.get("volumes", [])), name


def test_compose_collector_can_be_scaled(monkeypatch: pytest.MonkeyPatch):
    collector = compose()["services"]["collector"]
    assert "container_name" not in collector
    assert "hostname" not in collector
    for port in collector.get("ports", []):
        published = port.get("published") if isinstance(port, dict) else \
            (str(port).rsplit(":", 1)[0] if ":" in str(port) else None)
        assert not published, f"collector publishes a fixed host port: {port!r}"
    assert collector["stop_grace_period"] == "30s"
    # Each replica advertises its own hostname; `$$` is compose's escape for a literal `$`.
    args = parse(compose_argv(collector), {}, monkeypatch)
    assert args.advertise_url == "http://$(hostname):8200"
    assert "$$(hostname)" in collector["command"][0]


def test_compose_run_dir_is_on_the_runs_volume():
    doc = compose()
    coordinator = doc["services"]["coordinator"]
    assert "runs" in doc["volumes"]
    assert "runs:/runs" in coordinator["volumes"]
    assert compose_env(coordinator)["RLFLEET_RUN_DIR"].startswith("/runs/")


def test_compose_token_comes_from_the_environment():
    for role in ROLES:
        token = compose()["services"][role]["environment"]["RLFLEET_TOKEN"]
        assert token.startswith("${RLFLEET_TOKEN:?"), f"{role}: RLFLEET_TOKEN is required"


def test_the_coordinator_runs_under_gunicorn_and_resumes(monkeypatch: pytest.MonkeyPatch):
    """Compose and Kubernetes serve the coordinator with gunicorn and the shipped config; a
    restarted container resumes the run, and the container's stop grace leaves gunicorn its
    graceful_timeout for requests in flight and then the final snapshot."""
    from rlfleet import gunicorn_conf

    service, container = compose()["services"]["coordinator"], k8s_container("coordinator")
    assert service["entrypoint"] == container["command"] == ["gunicorn"]
    for env in (compose_env(service), k8s_env(container)):
        assert parse(["coordinator"], env, monkeypatch).resume
    pod = k8s_object("Deployment", "coordinator")["spec"]["template"]["spec"]
    for grace_s in (int(service["stop_grace_period"].removesuffix("s")),
                    pod["terminationGracePeriodSeconds"]):
        assert grace_s >= gunicorn_conf.graceful_timeout + 10, grace_s


def test_compose_and_k8s_admit_workers_from_their_own_networks_only():
    """The coordinator POSTs tasks to the URL a worker registers: in both deployments it
    takes private addresses (compose's and pods' networks), never link-local (a cloud
    metadata service), loopback (itself) or public ones."""
    from rlfleet.coordinator.admission import NotAdmitted, WorkerNetworks

    for env in (compose_env(compose()["services"]["coordinator"]),
                k8s_env(k8s_container("coordinator"))):
        networks = WorkerNetworks(env["RLFLEET_WORKER_NETWORKS"].split(","))
        for inside in ("http://172.18.0.5:8200", "http://10.244.1.7:8200",
                       "http://192.168.16.3:8100"):
            networks.check(inside)
        for outside in ("http://169.254.169.254:80", "http://127.0.0.1:8000",
                        "http://8.8.8.8:80"):
            with pytest.raises(NotAdmitted):
                networks.check(outside)


# -- the same commands in compose and Kubernetes --------------------------------------------

@pytest.mark.parametrize("role", list(ROLES))
def test_commands_parse_with_the_cli_and_agree(role: str, monkeypatch: pytest.MonkeyPatch):
    service = compose()["services"][role]
    container = k8s_container(role)
    runs = {
        "compose": (compose_argv(service), compose_env(service)),
        "k8s": (k8s_argv(container), k8s_env(container)),
    }
    parsed = {where: parse(argv, env, monkeypatch) for where, (argv, env) in runs.items()}
    for where, args in parsed.items():
        assert args.command == role, where
        assert (args.host, args.port) == ("0.0.0.0", ROLES[role]), where
        if role == "coordinator":
            assert args.config and args.storage.startswith("redis://redis:6379/"), where
            assert args.run_dir.startswith("/runs/"), where
        else:
            assert args.coordinator == "http://coordinator:8000", where
            assert re.fullmatch(rf"http://[^/:]+:{ROLES[role]}", args.advertise_url), \
                f"{where}: advertise URL {args.advertise_url!r}"
    names = {where: settings(argv, env) for where, (argv, env) in runs.items()}
    assert names["compose"] == names["k8s"], f"{role}: compose and k8s set different settings"
    unknown = names["compose"] - cli_env_names()
    assert not unknown, f"{role}: services/cli.py reads no {sorted(unknown)}"


def test_k8s_services_match_the_addresses_workers_use():
    coordinator = k8s_object("Service", "coordinator")
    assert coordinator["spec"]["ports"][0]["port"] == ROLES["coordinator"]
    redis = k8s_object("Service", "redis")
    assert redis["spec"]["ports"][0]["port"] == 6379
    storage = k8s_env(k8s_container("coordinator"))["RLFLEET_STORAGE"]
    assert storage.startswith("redis://redis:6379/")


# -- deploy/k8s -----------------------------------------------------------------------------

def test_k8s_manifests_parse_and_name_themselves():
    files = sorted(p.name for p in K8S.glob("*.yaml") if p.name not in
                   ("kustomization.yaml", "run-config.yaml"))
    assert files, "no manifests in deploy/k8s"
    for doc in k8s_docs(files):
        assert doc.get("apiVersion") and doc.get("kind"), doc
        assert doc.get("metadata", {}).get("name"), f"{doc['kind']} without metadata.name"


def test_kustomization_resources_exist():
    kust = kustomization()
    assert kust["kind"] == "Kustomization"
    for name in kust["resources"]:
        assert (K8S / name).is_file(), f"kustomization.yaml lists missing {name}"
    namespace = k8s_object("Namespace", kust["namespace"])
    assert namespace["metadata"]["name"] == "rlfleet"


def test_run_config_is_the_cartpole_config():
    from rlfleet.shared.run.config import load_config

    (generator,) = kustomization()["configMapGenerator"]
    (entry,) = generator["files"]
    key, _, path = entry.partition("=")
    assert (K8S / path).read_bytes() == (REPO / "configs" / "cartpole-dqn.yaml").read_bytes(), \
        "deploy/k8s/run-config.yaml differs from configs/cartpole-dqn.yaml: copy it again"
    load_config(K8S / path)
    # The coordinator reads it where the ConfigMap is mounted.
    spec = k8s_object("Deployment", "coordinator")["spec"]["template"]["spec"]
    config_path = Path(k8s_env(spec["containers"][0])["RLFLEET_CONFIG"])
    volume = next(v for v in spec["volumes"] if v.get("configMap", {}).get("name") ==
                  generator["name"])
    mount = next(m for m in spec["containers"][0]["volumeMounts"] if m["name"] == volume["name"])
    assert (Path(mount["mountPath"]), key) == (config_path.parent, config_path.name)


def test_one_image_for_every_role():
    (image,) = kustomization()["images"]
    for role in ROLES:
        assert k8s_container(role)["image"] == image["name"], role
    for role in ROLES:
        assert compose()["services"][role]["image"].split(":")[0] == image["name"], role


@pytest.mark.parametrize("role", list(ROLES))
def test_k8s_probes_hit_health_on_the_container_port(role: str):
    container = k8s_container(role)
    ports = {p.get("name"): p["containerPort"] for p in container["ports"]}
    assert ROLES[role] in ports.values()
    for probe in ("readinessProbe", "livenessProbe"):
        get = container[probe]["httpGet"]
        port = ports[get["port"]] if isinstance(get["port"], str) else get["port"]
        assert (get["path"], port) == ("/health", ROLES[role]), f"{role} {probe}"


@pytest.mark.parametrize("role", ["learner", "collector"])
def test_k8s_workers_advertise_their_pod_ip(role: str):
    env = k8s_container(role)["env"]
    names = [e["name"] for e in env]
    pod_ip = env[names.index("POD_IP")]
    assert pod_ip["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    advertise = env[names.index("RLFLEET_ADVERTISE_URL")]
    assert names.index("POD_IP") < names.index("RLFLEET_ADVERTISE_URL"), \
        "$(POD_IP) expands only after POD_IP is defined"
    assert advertise["value"] == f"http://$(POD_IP):{ROLES[role]}"
    # the pod's name is its worker id: a restarted container takes its own task back
    worker_id = env[names.index("RLFLEET_WORKER_ID")]
    assert worker_id["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}


def test_k8s_coordinator_and_collector_shape():
    coordinator = k8s_object("Deployment", "coordinator")["spec"]
    assert coordinator["replicas"] == 1 and coordinator["strategy"]["type"] == "Recreate"
    collector = k8s_object("Deployment", "collector")["spec"]["template"]["spec"]
    assert collector["terminationGracePeriodSeconds"] == 30


def test_hpa_targets_the_collector_deployment():
    hpa = k8s_object("HorizontalPodAutoscaler", "collector")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                             "name": "collector"}
    (metric,) = hpa["spec"]["metrics"]
    assert metric["resource"]["name"] == "cpu"
    # Utilization is relative to the request, so the collector must request CPU.
    assert k8s_container("collector")["resources"]["requests"]["cpu"]


def test_every_rlfleet_container_reads_the_token_secret():
    secret = k8s_object("Secret", TOKEN_SECRET)
    keys = set(secret.get("stringData", {})) | set(secret.get("data", {}))
    for role in ROLES:
        env = {e["name"]: e for e in k8s_container(role)["env"]}
        ref = env["RLFLEET_TOKEN"]["valueFrom"]["secretKeyRef"]
        assert ref["name"] == TOKEN_SECRET and ref["key"] in keys, role


# -- crashes and restarts -------------------------------------------------------------------

def redis_appendonly(argv: list[str]) -> dict[str, str]:
    """`redis-server --appendonly yes --appendfsync everysec` as {option: value}."""
    assert argv and argv[0] == "redis-server", argv
    words = argv[1:]
    return {words[i].removeprefix("--"): words[i + 1] for i in range(0, len(words) - 1, 2)}


@pytest.mark.parametrize("where", ["compose", "k8s"])
def test_coordinator_resumes_its_run_when_restarted(where: str,
                                                    monkeypatch: pytest.MonkeyPatch):
    """A restarted coordinator container or pod must restore the run from storage, not start
    a new one beside the workers still training the old one."""
    if where == "compose":
        service = compose()["services"]["coordinator"]
        argv, env = compose_argv(service), compose_env(service)
    else:
        container = k8s_container("coordinator")
        argv, env = k8s_argv(container), k8s_env(container)
    assert parse(argv, env, monkeypatch).resume is True, f"{where}: no --resume"


def test_compose_restarts_every_rlfleet_service_whatever_its_exit_code():
    """A role exits 1 when its loop dies (services/serve.py) and 0 when it stops cleanly;
    `restart: on-failure` would leave the latter stopped, as a Kubernetes Deployment never
    does."""
    services = compose()["services"]
    for name in (*ROLES, "redis"):
        assert services[name].get("restart") in ("unless-stopped", "always"), name


def test_redis_persists_with_the_append_only_file():
    """Without AOF a restarted Redis comes back without what rlfleet was told is written."""
    redis = compose()["services"]["redis"]
    assert redis_appendonly(redis["command"])["appendonly"] == "yes"
    assert any(v.split(":")[1] == "/data" for v in redis["volumes"]), "compose: no /data volume"
    container = k8s_container("redis")
    assert redis_appendonly(k8s_argv(container))["appendonly"] == "yes"
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == "/data"]
    spec = k8s_object("Deployment", "redis")["spec"]["template"]["spec"]
    (volume,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    claim = volume["persistentVolumeClaim"]["claimName"]
    assert k8s_object("PersistentVolumeClaim", claim)["spec"]["resources"]["requests"]


# -- services/Dockerfile ------------------------------------------------------------------

def dockerfile_instructions() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    lines = [line.strip() for line in text.splitlines()]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1])
            for line in lines if line and not line.startswith("#")]


def test_dockerfile():
    instructions = dockerfile_instructions()

    def all_of(name: str) -> list[str]:
        return [arg for instr, arg in instructions if instr == name]

    assert all_of("FROM") == ["python:3.11-slim"]
    user = all_of("USER")[-1].split(":")[0]
    assert user not in ("root", "0"), "the image must run as a non-root user"
    assert all_of("WORKDIR")[-1] == "/app"
    assert json.loads(all_of("ENTRYPOINT")[-1]) == ["rlfleet"]
    assert json.loads(all_of("CMD")[-1]) == ["--help"]
    # torch at the pin every install here uses (constraints/pinned.txt), from the CPU index by
    # default; `--build-arg TORCH_INDEX=` where it cannot be reached
    assert "constraints/pinned.txt /etc/rlfleet-constraints.txt" in all_of("COPY")
    pips = [r for r in all_of("RUN") if "pip install" in r]
    assert pips and all("-c /etc/rlfleet-constraints.txt" in r for r in pips), pips
    torch = [r for r in pips if r.endswith(" torch")]
    assert "TORCH_INDEX=https://download.pytorch.org/whl/cpu" in all_of("ARG"), \
        "torch must come from the CPU index by default"
    assert torch and '${TORCH_INDEX:+--extra-index-url "$TORCH_INDEX"}' in torch[0]
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert pyproject["project"]["scripts"]["rlfleet"] == "rlfleet.cli:main"
    copied = " ".join(all_of("COPY"))
    folders = pyproject["tool"]["setuptools"]["package-dir"].values()
    for needed in ["pyproject.toml", *(f"{p}/" for p in folders)]:
        assert needed in copied, f"the Dockerfile does not copy {needed}"


def test_dockerignore_keeps_the_context_small():
    ignored = {line.strip().rstrip("/") for line in (REPO / ".dockerignore").read_text()
               .splitlines() if line.strip() and not line.startswith("#")}
    assert {".venv", "runs", "tests", ".git", "bench"} <= ignored
    copied = " ".join(arg for instr, arg in dockerfile_instructions() if instr == "COPY")
    for pattern in ignored:
        assert not re.search(rf"(^|\s){re.escape(pattern)}(/|\s)", copied), \
            f".dockerignore drops {pattern}, which the Dockerfile copies"


# -- the real tools, where installed ----------------------------------------------------------

def test_kustomize_builds():
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed (the manifests are still checked by parsing)")
    done = subprocess.run(["kubectl", "kustomize", str(K8S)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    built = [d for d in yaml.safe_load_all(done.stdout) if d]
    config_map = next(d for d in built if d["kind"] == "ConfigMap")
    assert config_map["metadata"]["name"].startswith("rlfleet-config-")
    (image,) = kustomization()["images"]
    for doc in built:
        if doc["kind"] == "Deployment" and doc["metadata"]["name"] in ROLES:
            assert doc["metadata"]["namespace"] == "rlfleet"
            (container,) = doc["spec"]["template"]["spec"]["containers"]
            assert container["image"] == f"{image['newName']}:{image['newTag']}"
        if doc["kind"] == "Deployment" and doc["metadata"]["name"] == "coordinator":
            volumes = doc["spec"]["template"]["spec"]["volumes"]
            assert config_map["metadata"]["name"] in json.dumps(volumes)
