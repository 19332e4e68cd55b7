"""The GPU deployment files: docker-compose.gpu.yml, the Kubernetes Component in
deploy/k8s/gpu/, services/Dockerfile's torch index, the scripts that carry rlfleet to a GPU
machine without a package index (deploy/gpu-wheels.sh, deploy/gpu-install.sh) and docs/gpu.md.

No Docker engine, no cluster and no GPU: every file is parsed and checked against what it must
agree with (the base compose file and manifests, the run config's fields, the CLI's
overrides). Where kubectl is installed, the base with the Component on is built for real.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "docker-compose.yml"
COMPOSE_GPU = REPO / "docker-compose.gpu.yml"
DOCKERFILE = REPO / "services" / "Dockerfile"
K8S = REPO / "deploy" / "k8s"
GPU = K8S / "gpu"
SCHEMA = REPO / "tests" / "integration" / "data" / "compose-spec.json"
SCRIPTS = [REPO / "deploy" / "gpu-wheels.sh", REPO / "deploy" / "gpu-install.sh"]
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def load(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def interpolate(value: str, env: dict[str, str] | None = None) -> str:
    """`${VAR:-default}` as compose reads it, with `env` for the shell's variables."""
    env = env or {}
    return re.sub(r"\$\{(\w+):-([^}]*)\}", lambda m: env.get(m.group(1)) or m.group(2),
                  str(value))


def overrides(text: str) -> dict[str, str]:
    """Dotted KEY=VALUE items as RLFLEET_OVERRIDES holds them (shell-split), later wins."""
    return dict(item.split("=", 1) for item in shlex.split(text))


# -- docker-compose.gpu.yml -----------------------------------------------------------------

def test_compose_gpu_learner_reserves_an_nvidia_gpu():
    learner = load(COMPOSE_GPU)["services"]["learner"]
    devices = learner["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}]


def test_compose_gpu_builds_the_learner_with_a_cuda_torch_index():
    base, gpu = load(COMPOSE)["services"], load(COMPOSE_GPU)["services"]
    learner = gpu["learner"]
    index = interpolate(learner["build"]["args"]["TORCH_INDEX"])
    assert re.fullmatch(r"https://download\.pytorch\.org/whl/cu\d{3}", index), index
    mine = interpolate(learner["build"]["args"]["TORCH_INDEX"],
                       {"RLFLEET_TORCH_INDEX": "https://mirror.example/cu126"})
    assert mine == "https://mirror.example/cu126"
    # Its own image name: the coordinator and collectors keep the CPU image they build.
    assert learner["image"] != base["coordinator"]["image"]
    assert base["learner"]["image"] == base["coordinator"]["image"]
    for name in ("coordinator", "collector"):
        assert "image" not in gpu.get(name, {}) and "build" not in gpu.get(name, {}), name
    # The override adds build arguments only: the context and Dockerfile stay the base's.
    assert set(learner["build"]) == {"args"}
    assert base["learner"]["build"]["dockerfile"] == "services/Dockerfile"


def test_compose_gpu_run_config_trains_on_cuda_and_keeps_the_users_overrides():
    """Workers get the run config from the coordinator, so the override goes to its
    RLFLEET_OVERRIDES, before the operator's own (which still win: later items do)."""
    base_env = load(COMPOSE)["services"]["coordinator"]["environment"]
    env = load(COMPOSE_GPU)["services"]["coordinator"]["environment"]
    assert set(env) <= set(base_env), "the override only changes existing variables"
    value = env["RLFLEET_OVERRIDES"]
    assert overrides(interpolate(value)) == {"learner.device": "cuda"}
    mine = overrides(interpolate(value, {"RLFLEET_OVERRIDES": "learner.precision=bf16 "
                                         "learner.device=cuda:1"}))
    assert mine == {"learner.device": "cuda:1", "learner.precision": "bf16"}


def test_compose_gpu_overrides_parse_as_the_coordinator_reads_them(
        monkeypatch: pytest.MonkeyPatch):
    from rlfleet.roles import env_overrides
    from rlfleet.shared.run.config import load_config

    value = load(COMPOSE_GPU)["services"]["coordinator"]["environment"]["RLFLEET_OVERRIDES"]
    monkeypatch.setenv("RLFLEET_OVERRIDES",
                       interpolate(value, {"RLFLEET_OVERRIDES": "learner.precision=bf16"}))
    cfg = load_config(str(REPO / "configs" / "cartpole-dqn.yaml"), env_overrides())
    assert (cfg.learner.device, cfg.learner.precision) == ("cuda", "bf16")
    assert cfg.collector.device == "cpu"


def test_compose_gpu_file_matches_the_compose_spec_schema():
    jsonschema = pytest.importorskip("jsonschema")
    validator = jsonschema.Draft201909Validator(json.loads(SCHEMA.read_text()))
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
              for e in validator.iter_errors(load(COMPOSE_GPU))]
    assert errors == []


# -- services/Dockerfile --------------------------------------------------------------------

def dockerfile_instructions() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    lines = [line.strip() for line in text.splitlines()]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1])
            for line in lines if line and not line.startswith("#")]


def test_dockerfile_takes_the_torch_index_and_defaults_to_the_cpu_one():
    instructions = dockerfile_instructions()
    args = [a for i, a in instructions if i == "ARG"]
    assert f"TORCH_INDEX={CPU_INDEX}" in args
    pips = [a for i, a in instructions if i == "RUN" and "pip install" in a]
    assert len(pips) == 2, pips
    (torch,) = [p for p in pips if p.endswith(" torch")]
    # The default path: the pinned torch, from the index named (nothing else decides it).
    assert re.sub(r"\s+", " ", torch) == (
        'pip install ${TORCH_INDEX:+--extra-index-url "$TORCH_INDEX"} '
        "-c /etc/rlfleet-constraints.txt torch")
    assert all('${TORCH_INDEX:+--extra-index-url "$TORCH_INDEX"}' in p and
               "-c /etc/rlfleet-constraints.txt" in p for p in pips)
    # The ARG comes before the first use.
    order = [i for i, a in instructions if i == "ARG" and a.startswith("TORCH_INDEX=")
             or i == "RUN" and "TORCH_INDEX" in a]
    assert order[0] == "ARG"


# -- deploy/k8s/gpu -------------------------------------------------------------------------

def component() -> dict[str, Any]:
    return load(GPU / "kustomization.yaml")


def patch(kind: str, name: str) -> dict[str, Any]:
    found = [d for p in component()["patches"] for d in yaml.safe_load_all(
        (GPU / p["path"]).read_text()) if d and d["kind"] == kind
        and d["metadata"]["name"] == name]
    assert len(found) == 1, f"one patch of {kind} {name} expected, found {len(found)}"
    return found[0]


def test_k8s_gpu_component_references_existing_files():
    kust = component()
    assert kust["kind"] == "Component"
    assert kust["apiVersion"] == "kustomize.config.k8s.io/v1alpha1"
    for p in kust["patches"]:
        assert (GPU / p["path"]).is_file(), p
    for name in kust.get("resources", []):
        assert (GPU / name).is_file(), name
    # Opting in is one uncommented line of the base.
    base = (K8S / "kustomization.yaml").read_text()
    assert re.search(r"^# components:\n#\s+- gpu$", base, re.M), "the base's opt-in line"


def test_k8s_gpu_patch_gives_the_learner_one_gpu_and_the_cuda_image():
    spec = patch("Deployment", "learner")["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    assert container["name"] == "learner"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert "nvidia.com/gpu" not in container["resources"].get("requests", {})
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in \
        spec["tolerations"]
    (image,) = [i for i in component()["images"] if i["name"] == container["image"]]
    base_images = [i["name"] for i in load(K8S / "kustomization.yaml")["images"]]
    assert container["image"] not in base_images, \
        "the base's images entry would rename the CUDA image back to the CPU one"
    assert image["newName"] and image["newTag"]


def test_k8s_gpu_patch_sets_learner_device_cuda_at_the_coordinator():
    (container,) = patch("Deployment", "coordinator")["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert overrides(env["RLFLEET_OVERRIDES"])["learner.device"] == "cuda"
    (base,) = [d for d in yaml.safe_load_all((K8S / "coordinator.yaml").read_text())
               if d and d["kind"] == "Deployment"]
    names = [e["name"] for e in base["spec"]["template"]["spec"]["containers"][0]["env"]]
    assert "RLFLEET_OVERRIDES" in names, "the patch must merge into an existing variable"


def test_k8s_gpu_component_builds(tmp_path: Path):
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed (the files are still checked by parsing)")
    copy = tmp_path / "k8s"
    shutil.copytree(K8S, copy)
    kust = copy / "kustomization.yaml"
    kust.write_text(re.sub(r"^# components:\n#(\s+- gpu)$", r"components:\n\1",
                           kust.read_text(), flags=re.M))
    done = subprocess.run(["kubectl", "kustomize", str(copy)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    deployments = {d["metadata"]["name"]: d for d in yaml.safe_load_all(done.stdout)
                   if d and d["kind"] == "Deployment"}
    learner = deployments["learner"]["spec"]["template"]["spec"]["containers"][0]
    assert learner["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert learner["image"] == "rlfleet-cuda:latest"
    assert {e["name"] for e in learner["env"]} >= {"RLFLEET_TOKEN", "RLFLEET_COORDINATOR"}
    for role in ("coordinator", "collector"):
        (c,) = deployments[role]["spec"]["template"]["spec"]["containers"]
        assert c["image"] == "rlfleet:latest", role
        assert "nvidia.com/gpu" not in json.dumps(c["resources"]), role
    coordinator = deployments["coordinator"]["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in coordinator["env"]}
    assert env["RLFLEET_OVERRIDES"] == "learner.device=cuda"
    assert "RLFLEET_TOKEN" in env


# -- the scripts and the docs ---------------------------------------------------------------

@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_scripts_parse(script: Path):
    done = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 0, done.stderr
    assert script.read_text().startswith("#!/usr/bin/env bash\n")
    assert "set -euo pipefail" in script.read_text()


def test_the_wheel_folder_is_ignored():
    wheels = REPO / "deploy" / "gpu-wheels.sh"
    assert "OUT=${GPU_WHEELS_DIR:-.gpu-wheels}" in wheels.read_text()
    assert ".gpu-wheels/" in (REPO / ".gitignore").read_text().splitlines()


def test_gpu_install_never_touches_the_system_python():
    text = re.sub(r"\\\n", " ", (REPO / "deploy" / "gpu-install.sh").read_text())
    pip = re.search(r"^\s*\S+ -m pip install .*$", text, re.M)
    assert pip, "no pip install"
    for flag in ("--no-index", "--no-deps", "--target"):
        assert flag in pip.group(0), flag
    assert "--save ''" in text and "--appendonly no" in text and "--daemonize yes" in text


def test_docs_gpu_names_the_config_fields_and_is_in_the_nav():
    from rlfleet.shared.contract.config import CollectorConfig, LearnerConfig

    text = (REPO / "docs" / "gpu.md").read_text()
    for field in ("learner.device", "learner.precision", "learner.pin_memory",
                  "collector.device"):
        assert f"`{field}`" in text, field
    assert {"device", "precision", "pin_memory"} <= set(LearnerConfig.model_fields)
    assert "device" in CollectorConfig.model_fields
    for name in ("docker-compose.gpu.yml", "deploy/k8s/gpu/", "deploy/gpu-wheels.sh",
                 "deploy/gpu-install.sh", "/api/v1/workers", "rlfleet status"):
        assert name in text, name
    nav = json.dumps(load(REPO / "mkdocs.yml")["nav"])
    assert '"gpu.md"' in nav
