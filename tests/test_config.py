"""Typed configs: dataclass fields become dotted or plain flags, YAML files give defaults, errors name the key."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Literal

import pytest

from r3_env.config import ConfigError, add_dataclass_arguments, build_config, load_yaml


@dataclass(frozen=True)
class Example:
    lr: float = 1e-5
    n_samples_per_prompt: int = field(default=4, metadata={"help": "samples per prompt"})
    estimator: Literal["gae", "group_norm"] = "gae"
    colocate: bool = False
    name: str | None = None

    def __post_init__(self) -> None:
        if self.n_samples_per_prompt < 1:
            raise ValueError("n_samples_per_prompt must be at least 1")


def _parse(argv: list[str], prefix: str = "") -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_dataclass_arguments(parser, Example, prefix)
    return parser.parse_args(argv)


def test_defaults_flags_and_dotted_prefix():
    assert build_config(Example, _parse([])) == Example()
    args = _parse(
        ["--rollout.n_samples_per_prompt", "8", "--rollout.colocate", "--rollout.estimator", "group_norm"],
        prefix="rollout.",
    )
    assert build_config(Example, args, prefix="rollout.") == Example(
        n_samples_per_prompt=8, estimator="group_norm", colocate=True
    )
    assert build_config(Example, _parse(["--n-samples-per-prompt", "2", "--no-colocate"])).n_samples_per_prompt == 2


def test_file_values_are_overridden_by_flags(tmp_path):
    (tmp_path / "c.yaml").write_text("lr: 3.0e-6\nname: run1\nn_samples_per_prompt: 2\n")
    values = load_yaml(tmp_path / "c.yaml")
    config = build_config(Example, _parse(["--lr", "1e-4"]), file_values=values, where="c.yaml")
    assert config == Example(lr=1e-4, name="run1", n_samples_per_prompt=2)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"lr": 1, "typo_key": 2}, "unknown key 'typo_key'; valid keys: colocate, estimator, lr"),
        ({"n_samples_per_prompt": "four"}, "n_samples_per_prompt must be int, got 'four'"),
        ({"n_samples_per_prompt": 2.5}, "n_samples_per_prompt must be int"),
        ({"estimator": "ppo"}, "estimator must be one of gae, group_norm"),
        ({"colocate": "maybe"}, "colocate must be bool"),
        ({"lr": None}, "lr may not be null"),
        ({"n_samples_per_prompt": True}, "n_samples_per_prompt must be int, got True"),
        ({"n_samples_per_prompt": 0}, "n_samples_per_prompt must be at least 1"),
    ],
)
def test_bad_values_name_the_key(values, message):
    with pytest.raises(ConfigError, match=message):
        build_config(Example, file_values=values, where="my.yaml")


def test_yaml_errors(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_yaml(tmp_path / "missing.yaml")
    (tmp_path / "list.yaml").write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="must be a mapping"):
        load_yaml(tmp_path / "list.yaml")
    (tmp_path / "bad.yaml").write_text("a: [1,\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_yaml(tmp_path / "bad.yaml")
    (tmp_path / "empty.yaml").write_text("")
    assert load_yaml(tmp_path / "empty.yaml") == {}


@dataclass(frozen=True)
class Service:
    port: int = 8000
    host: str = "127.0.0.1"


def test_configs_from_args_reads_top_level_and_nested_sections(tmp_path):
    from r3_env.config import configs_from_args

    parser = argparse.ArgumentParser()
    parser.add_argument("--config")
    add_dataclass_arguments(parser, Example)
    add_dataclass_arguments(parser, Service, prefix="service.")
    (tmp_path / "c.yaml").write_text("lr: 2.0e-6\nservice:\n  port: 9000\n  host: 0.0.0.0\n")
    args = parser.parse_args(["--config", str(tmp_path / "c.yaml"), "--service.port", "9100"])
    example, service = configs_from_args(args, [("", Example), ("service.", Service)])
    assert example == Example(lr=2e-6) and service == Service(port=9100, host="0.0.0.0")
    (tmp_path / "bad.yaml").write_text("lr: 1.0\nservise: {}\n")
    with pytest.raises(ConfigError, match="unknown key 'servise'; valid keys: .*service"):
        configs_from_args(
            parser.parse_args(["--config", str(tmp_path / "bad.yaml")]), [("", Example), ("service.", Service)]
        )
    (tmp_path / "flat.yaml").write_text("service: 8000\n")
    with pytest.raises(ConfigError, match="'service' must be a mapping"):
        configs_from_args(
            parser.parse_args(["--config", str(tmp_path / "flat.yaml")]), [("", Example), ("service.", Service)]
        )
