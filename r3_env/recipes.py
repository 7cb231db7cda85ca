"""Recipes: one YAML file per method (``recipes/r3.yaml``, ``lws.yaml``, ``r2ag.yaml``) or per design measured on one
(``r3_recall.yaml``), where its settings live.

A recipe holds the agent's sections, which every rollout actor reads through ``$R3RAG_AGENT_CONFIG``
(``env:``, ``reward:``, ``services:``, ``policy:``, the step format and its ``format_options`` included),
``algo:`` (the RL algorithm and its budget on OpenRLHF, read by the launch scripts) and, for R2AG,
``tree:`` (the retrieval tree's expansion rules, read by evaluation and the progressive driver; the
tree's survivors are the reward's ``survivors_base`` / ``survivors_predicted``). The demo, the launch
scripts (``python -m r3_env.recipes``), evaluation and ``r3rag r2ag train`` all load it here. The ``multi_query``
format and the ``top_survivor`` reward have no defaults of their own: what they are not given is R2AG's recipe's
(:func:`r2ag_agent`).

    recipe = load_recipe("lws")             # or a path: load_recipe("my/frugal.yaml")
    recipe.rollout_config().reward.scheme   # 'lws'
    recipe.algo.name                        # 'dapo'
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from r3_env.config import ConfigError, build_config, load_yaml

if TYPE_CHECKING:
    from r3_env.rollout_config import RolloutConfig
    from r3_env.tree import TreeConfig


def recipes_dir() -> Path:
    """The copy of recipes/ a wheel installs inside r3_env (setup.py's BuildWithRecipes), else the source
    checkout's recipes/ (editable installs included: a checkout never holds the copy)."""
    installed = Path(__file__).resolve().parent / "recipe_files"
    return installed if installed.is_dir() else Path(__file__).resolve().parents[1] / "recipes"


RECIPES_DIR = recipes_dir()
RECIPES = ("r3", "r3_recall", "lws", "r2ag")  # recipes/<name>.yaml
AGENT_SECTIONS = ("env", "reward", "services", "policy")
LAUNCH_SECTIONS = frozenset({"algo", "tree"})  # the recipe's other sections: launch scripts' and evaluation's
CONFIG_ENV = "R3RAG_AGENT_CONFIG"  # the recipe (or a file of agent sections) the rollout actors read
OVERRIDES_ENV = "R3RAG_AGENT_OVERRIDES"  # JSON object of dotted keys over it, e.g. {"services.reward_url": "..."}


@dataclass(frozen=True)
class AlgoSection:
    """The RL algorithm and its budget on OpenRLHF; each field is one of launch/ppo_r3.sh's variables.

    An empty, zero or false field leaves the variable to the launch script (its default for the algorithm);
    ``kl_coef`` is a string so that "0" (no KL term, no reference model) differs from unset.
    """

    name: Literal["", "ppo", "grpo", "reinforce++", "dapo"] = field(default="", metadata={"variable": "ALGO"})
    model: str = field(default="", metadata={"variable": "POLICY"})  # the policy RL starts from
    label_key: str = field(default="", metadata={"variable": "LABEL_KEY"})
    rollout_batch: int = field(default=0, metadata={"variable": "ROLLOUT_BATCH"})
    samples_per_prompt: int = field(default=0, metadata={"variable": "SAMPLES_PER_PROMPT"})
    actor_lr: float = field(default=0.0, metadata={"variable": "ACTOR_LR"})
    top_p: float = field(default=0.0, metadata={"variable": "TOP_P"})
    temperature: float = field(default=0.0, metadata={"variable": "TEMPERATURE"})  # of the rollouts
    kl_coef: str = field(default="", metadata={"variable": "KL_COEF"})
    dynamic_filtering: bool = field(default=False, metadata={"variable": "DYNAMIC_FILTERING"})
    max_len: int = field(default=0, metadata={"variable": "MAX_LEN"})
    episodes: int = field(default=0, metadata={"variable": "EPISODES"})
    steps: int = field(default=0, metadata={"variable": "STEPS"})  # at most this many training steps
    dynamic_filtering_range: str = field(default="", metadata={"variable": "DYNAMIC_FILTERING_RANGE"})

    def __post_init__(self) -> None:
        numbers = ("rollout_batch", "samples_per_prompt", "actor_lr", "top_p", "temperature", "max_len", "episodes",
                   "steps")  # fmt: skip
        for name in numbers:
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be 0 (the launch script's default) or more, got {getattr(self, name)}")
        # as the launch script's require_number reads it
        if self.kl_coef and not re.fullmatch(r"(0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?", self.kl_coef):
            raise ValueError(f"kl_coef must be a number of 0 or more ('0': no KL term), got {self.kl_coef!r}")

    def variables(self) -> dict[str, str]:
        """The launch variables this recipe sets, as the shell reads them."""
        values = {item.metadata["variable"]: getattr(self, item.name) for item in dataclasses.fields(self)}
        # a switch as the shell reads it: DYNAMIC_FILTERING=1
        return {name: str(int(value) if isinstance(value, bool) else value) for name, value in values.items() if value}


@dataclass(frozen=True)
class TreeSection:
    """R2AG's retrieval tree at evaluation (``eval run --method rrt``): documents per query and L_MAX."""

    topk: int
    iterations: int

    def __post_init__(self) -> None:
        if self.topk < 1 or self.iterations < 1:
            raise ValueError(f"topk and iterations must be at least 1, got {self.topk}, {self.iterations}")


@dataclass(frozen=True)
class Recipe:
    name: str  # the file's stem
    path: Path
    agent: dict[str, Any]  # the agent's sections as written (env, reward, services, policy)
    algo: AlgoSection
    tree: TreeSection | None

    def rollout_config(self, overrides: dict[str, Any] | None = None) -> RolloutConfig:
        """The agent's config: this recipe's sections with ``overrides`` (dotted keys) over them."""
        from r3_env.rollout_config import RolloutConfig

        values = {section: dict(self.agent.get(section) or {}) for section in AGENT_SECTIONS}
        for key, value in (overrides or {}).items():
            section, _, name = key.partition(".")
            if section not in values or not name:
                raise ConfigError(f"{key!r} is not a dotted key of {', '.join(AGENT_SECTIONS)}, like 'env.topk'")
            values[section][name] = value
        return RolloutConfig.from_dict(values, where=str(self.path))

    def tree_config(self, **overrides: Any) -> TreeConfig:
        """The retrieval tree's rules: the tree section's topk and iterations, the reward's survivors."""
        from r3_env.tree import TreeConfig

        if self.tree is None:
            raise ConfigError(f"{self.path}: recipe {self.name!r} has no tree section (R2AG's recipe has one)")
        survivors = self.rollout_config().reward.options
        values = {
            "topk": self.tree.topk,
            "max_iterations": self.tree.iterations,
            "survivors_base": survivors.get("survivors_base"),
            "survivors_predicted": survivors.get("survivors_predicted"),
        }
        missing = [name for name, value in values.items() if value is None]
        if missing:
            raise ConfigError(f"{self.path}: reward.options lacks {', '.join(missing)}, the tree's Top-Survivor t")
        return TreeConfig(**{**values, **overrides})

    def get(self, key: str) -> Any:
        """A setting by dotted key (``reward.options``, ``algo.name``, ``tree.topk``)."""
        section, _, name = key.partition(".")
        if section in AGENT_SECTIONS:
            value: Any = dataclasses.asdict(getattr(self.rollout_config(), section))
        elif section in ("algo", "tree") and getattr(self, section) is not None:
            value = dataclasses.asdict(getattr(self, section))
        else:
            raise ConfigError(f"{self.path}: no section {section!r} in recipe {self.name!r}")
        for part in name.split(".") if name else ():
            if not isinstance(value, dict) or part not in value:
                raise ConfigError(f"{self.path}: no setting {key!r} in recipe {self.name!r}")
            value = value[part]
        return value


def recipe_path(name_or_path: str | Path) -> Path:
    """``r3`` -> recipes/r3.yaml; anything with a slash or a .yaml/.yml ending is a path."""
    text = str(name_or_path)
    if "/" in text or text.endswith((".yaml", ".yml")):
        return Path(text)
    path = RECIPES_DIR / f"{text}.yaml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in RECIPES_DIR.glob("*.yaml")))
        raise ConfigError(f"no recipe named {text!r} in {RECIPES_DIR} (known: {known}); or give a recipe file")
    return path


def load_recipe(name_or_path: str | Path) -> Recipe:
    """A recipe by name (r3, lws, r2ag) or path; a ConfigError names the file and the key at fault."""
    path = recipe_path(name_or_path).resolve()
    values = load_yaml(path)
    allowed = (*AGENT_SECTIONS, *sorted(LAUNCH_SECTIONS))
    for section, value in values.items():
        if section not in allowed:
            raise ConfigError(f"{path}: unknown section {section!r}; valid sections: {', '.join(allowed)}")
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: '{section}' must be a mapping of {section} settings")
    tree = values.get("tree")
    recipe = Recipe(
        name=path.stem,
        path=path,
        agent={section: values[section] for section in AGENT_SECTIONS if section in values},
        algo=build_config(AlgoSection, file_values=values.get("algo"), where=f"{path} (algo)"),
        tree=None if tree is None else build_config(TreeSection, file_values=tree, where=f"{path} (tree)"),
    )
    recipe.rollout_config()  # the agent's sections are checked here, not in a rollout actor
    return recipe


@functools.cache
def r2ag_agent() -> RolloutConfig:
    """R2AG's agent sections (recipes/r2ag.yaml), loaded once: the multi_query format's limits
    (policy.format_options) and the top_survivor reward's constants (reward.options) not given elsewhere."""
    return load_recipe("r2ag").rollout_config()


def json_object(text: str, what: str) -> dict[str, Any]:
    """``text`` as a JSON object; a ConfigError naming ``what`` otherwise."""
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise ConfigError(f"{what} must be a JSON object, got {text!r}")
    return value


def environment_overrides() -> dict[str, Any]:
    """``$R3RAG_AGENT_OVERRIDES``: a JSON object of dotted keys (empty when unset)."""
    return json_object(os.environ.get(OVERRIDES_ENV) or "{}", f"${OVERRIDES_ENV} (dotted keys)")


def agent_config_from_environment() -> RolloutConfig:
    """The agent's config in a rollout actor: the recipe at ``$R3RAG_AGENT_CONFIG`` with ``$R3RAG_AGENT_OVERRIDES``.

    OpenRLHF builds the agent executor with no arguments inside its rollout actors, so this is how the
    launch scripts configure it (the launcher forwards both variables to every Ray worker).
    """
    path = os.environ.get(CONFIG_ENV)
    overrides = environment_overrides()
    if path:
        return load_recipe(path).rollout_config(overrides)
    defaults = Recipe("defaults", Path(f"${OVERRIDES_ENV}"), {}, AlgoSection(), None)
    return defaults.rollout_config(overrides)


def merged_reward_options(recipe: Recipe, extra: str) -> dict[str, Any]:
    """The recipe's reward.options with ``extra`` (a JSON object, REWARD_OPTIONS) over them."""
    values = json_object(extra, 'REWARD_OPTIONS (like {"beta": 0.5})')
    return {**recipe.rollout_config().reward.options, **values}


def main(argv: list[str] | None = None) -> int:
    """The launch scripts' helper: ``python -m r3_env.recipes COMMAND ...`` (exit 2 with the reason)."""
    parser = argparse.ArgumentParser(prog="python -m r3_env.recipes", description=main.__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    shell = commands.add_parser("shell", help="recipe_path, recipe_name and recipe_<VARIABLE>=value lines for eval")
    shell.add_argument("recipe")
    get = commands.add_parser("get", help="one setting by dotted key (JSON unless a string)")
    get.add_argument("recipe")
    get.add_argument("key")
    options = commands.add_parser("reward-options", help="reward.options with a JSON object over them")
    options.add_argument("recipe")
    options.add_argument("extra")
    commands.add_parser("staged", help="1 when the agent's reward (from the environment) needs the training step")
    args = parser.parse_args(argv)
    try:
        if args.command == "shell":
            recipe = load_recipe(args.recipe)
            lines = {"recipe_path": str(recipe.path), "recipe_name": recipe.name}
            lines.update({f"recipe_{name}": value for name, value in recipe.algo.variables().items()})
            print("\n".join(f"{name}={shlex.quote(value)}" for name, value in lines.items()))
        elif args.command == "get":
            value = load_recipe(args.recipe).get(args.key)
            print(value if isinstance(value, str) else json.dumps(value))
        elif args.command == "reward-options":
            print(json.dumps(merged_reward_options(load_recipe(args.recipe), args.extra)))
        else:
            from r3_env.rewards import get_scheme

            reward = agent_config_from_environment().reward
            print(int(get_scheme(reward.scheme, **reward.options).needs_training_step))
    except (ConfigError, ValueError) as error:
        print(error, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
