"""recipes/<method>.yaml: one file per method, and the demo, the launch scripts, evaluation and the progressive
driver all read their settings from it (r3_env/recipes.py)."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys

import pytest
from conftest import ROOT
from test_openrlhf_plugin import launch_flags

from r3_env.config import ConfigError, configs_from_args
from r3_env.recipes import LAUNCH_SECTIONS, RECIPES, agent_config_from_environment, load_recipe, main

# each recipe's launch script, and the variables it needs besides the recipe's
LAUNCH = {
    "r3": ("ppo_r3.sh", {}),
    "r3_recall": ("ppo_r3.sh", {"RECIPE": "r3_recall"}),
    "lws": ("dapo_lws.sh", {}),
    "r2ag": ("dapo_r2ag.sh", {"PROMPT_DATA": "p.jsonl"}),
}
ESTIMATORS = {"ppo": "gae", "grpo": "group_norm", "reinforce++": "reinforce_baseline", "dapo": "group_norm"}


def flag_values(flags: list[str]) -> dict[str, list[str]]:
    """``--name value ...`` -> {name: [values]} (a switch maps to [])."""
    values: dict[str, list[str]] = {}
    name = ""
    for word in flags:
        if word.startswith("--"):
            name = word[2:]
            values[name] = []
        else:
            values[name].append(word)
    return values


def test_every_method_has_a_recipe_that_loads():
    assert sorted(path.stem for path in (ROOT / "recipes").glob("*.yaml")) == sorted(RECIPES)
    for name in RECIPES:
        recipe = load_recipe(name)
        assert recipe.path == ROOT / "recipes" / f"{name}.yaml" and recipe.name == name
        assert load_recipe(recipe.path) == recipe  # by name or by path
        assert recipe.algo.name in ESTIMATORS and recipe.algo.model and recipe.algo.rollout_batch
    assert (load_recipe("r2ag").tree is None, load_recipe("r3").tree, load_recipe("lws").tree) == (False, None, None)


@pytest.mark.parametrize("name", RECIPES)
def test_the_launch_dry_run_runs_the_recipe(name, monkeypatch):
    recipe = load_recipe(name)
    script, env = LAUNCH[name]
    flags, variables = launch_flags(script, **env)
    values = flag_values(flags)
    algo = recipe.algo
    assert variables["R3RAG_AGENT_CONFIG"] == str(recipe.path)
    assert values["algo.advantage.estimator"] == [ESTIMATORS[algo.name]]
    assert values["actor.model_name_or_path"] == [algo.model]
    assert values["rollout.batch_size"] == values["train.batch_size"] == [str(algo.rollout_batch)]
    assert float(values["actor.adam.lr"][0]) == algo.actor_lr
    assert values["data.max_len"] == [str(algo.max_len)] and values["train.num_episodes"] == [str(algo.episodes)]
    if algo.samples_per_prompt:
        assert values["rollout.n_samples_per_prompt"] == [str(algo.samples_per_prompt)]
    if algo.steps:
        assert values["data.max_samples"] == [str(algo.steps * algo.rollout_batch // algo.episodes)]
    if algo.top_p:
        assert float(values["rollout.top_p"][0]) == algo.top_p
    if algo.label_key:
        assert values["data.label_key"] == [algo.label_key]
    if algo.dynamic_filtering_range:
        assert values["algo.dynamic_filtering_range"] == algo.dynamic_filtering_range.split()
    if algo.dynamic_filtering:
        assert values["algo.dynamic_filtering_enable"] == []
    if algo.temperature:
        assert float(values["rollout.temperature"][0]) == algo.temperature
    if algo.kl_coef:
        assert float(values["algo.kl.init_coef"][0]) == float(algo.kl_coef)
    assert values["ckpt.output_dir"][0].startswith(f"checkpoints/{name}-")
    # the agent in every rollout actor reads the recipe, with the script's overrides over it
    (overrides,) = shlex.split(variables["R3RAG_AGENT_OVERRIDES"])
    monkeypatch.setenv("R3RAG_AGENT_CONFIG", variables["R3RAG_AGENT_CONFIG"])
    monkeypatch.setenv("R3RAG_AGENT_OVERRIDES", overrides)
    agent, written = agent_config_from_environment(), recipe.rollout_config()
    assert (agent.env, agent.policy) == (written.env, written.policy)
    assert (agent.reward.scheme, agent.reward.options, agent.reward.placement) == (
        written.reward.scheme,
        written.reward.options,
        written.reward.placement,
    )


@pytest.mark.parametrize("name", ["r3", "lws"])
def test_the_demo_trains_the_recipe(name, tmp_path):
    from demo.run import Demo, DemoConfig
    from demo.settings import METHODS as DEMO_METHODS

    recipe = load_recipe(name).rollout_config()
    method = DEMO_METHODS[name]
    assert method.step_format == recipe.policy.step_format
    demo = Demo(DemoConfig(out=str(tmp_path / "demo"), model="tiny-random", recipe=name, quick=True))
    settings = demo.train_config(tmp_path / "policy", "", tmp_path / "prompts.jsonl", "http://r", "http://j")
    assert settings.rollout.policy.step_format == recipe.policy.step_format
    reward = settings.rollout.reward
    assert (reward.scheme, reward.placement) == (recipe.reward.scheme, recipe.reward.placement)
    # the demo's own schedule (stage 2 half-way through its few iterations) over the recipe's other options
    switch = method.switch_at(demo.budget.ppo_iterations)
    assert reward.options == {**recipe.reward.options, **({} if switch is None else {"switch_step": switch})}
    estimator = ESTIMATORS[load_recipe(name).algo.name]
    assert settings.ppo.estimator == estimator


def test_evaluation_defaults_to_r2ags_recipe():
    from eval.methods import get_method
    from eval.run import EvalRunConfig

    recipe = load_recipe("r2ag")
    tree, limits = recipe.tree_config(), recipe.rollout_config().policy.format_options
    config = EvalRunConfig(data="x.jsonl", method="rrt")
    assert (config.rrt_topk, config.rrt_iterations) == (recipe.tree.topk, recipe.tree.iterations)
    survivors = (config.rrt_survivors_base, config.rrt_survivors_predicted)
    assert survivors == (tree.survivors_base, tree.survivors_predicted)
    assert (config.rrt_max_base, config.rrt_max_predicted) == (limits["max_base"], limits["max_predicted"])
    for method in (get_method("rrt", config), get_method("rrt", None)):
        settings = method.settings()["tree"]
        assert (settings["topk"], settings["max_iterations"]) == (tree.topk, tree.max_iterations)
        assert (settings["survivors_base"], settings["max_base"]) == (tree.survivors_base, limits["max_base"])


def test_r2ags_numbers_live_only_in_its_recipe(bpe_backend, tmp_path, monkeypatch):
    """The multi_query format and the top_survivor reward have no defaults in code: the parser, the reward server,
    the reward scheme and evaluation all take R2AG's limits, survivors and constants from recipes/r2ag.yaml."""
    from conftest import CHATML_TEMPLATE, make_tokenizer

    from eval.methods import get_method
    from eval.run import EvalRunConfig  # noqa: F401  (its defaults are read at import, from the recipe itself)
    from r3_env.protocol import FormatError, get_format, parse_step
    from r3_env.protocol.multi_query import MultiQueryFormat
    from r3_env.recipes import r2ag_agent
    from r3_env.rewards import TopSurvivorConfig, top_survivor_config
    from reward_server.app import _policy_renderer
    from reward_server.config import RewardConfig

    with pytest.raises(TypeError):
        MultiQueryFormat()
    with pytest.raises(TypeError):
        TopSurvivorConfig()
    written = load_recipe("r2ag").rollout_config()
    step_format = get_format("multi_query")
    assert {"max_base": step_format.max_base, "max_predicted": step_format.max_predicted} == (
        written.policy.format_options
    )
    assert top_survivor_config() == TopSurvivorConfig(**written.reward.options)
    # a recipe with other numbers: everything that reads R2AG's numbers follows it
    text = (ROOT / "recipes" / "r2ag.yaml").read_text()
    numbers = {"max_base": (4, 3), "max_predicted": (2, 1), "survivors_base": (4, 3), "survivors_predicted": (2, 1)}
    for name, (old, new) in numbers.items():
        assert f" {name}: {old} " in text
        text = text.replace(f" {name}: {old} ", f" {name}: {new} ")
    (tmp_path / "r2ag.yaml").write_text(text)
    tokenizer = tmp_path / "tokenizer"
    make_tokenizer(bpe_backend, CHATML_TEMPLATE).save_pretrained(tokenizer)
    monkeypatch.setattr("r3_env.recipes.RECIPES_DIR", tmp_path)
    r2ag_agent.cache_clear()
    try:
        expected = {name: new for name, (_, new) in numbers.items()}
        fmt = get_format("multi_query")
        assert (fmt.max_base, fmt.max_predicted) == (expected["max_base"], expected["max_predicted"])
        step = "<think>a</think>\n" + "<base-query>q</base-query>\n" * 3
        assert len(parse_step(step, "multi_query").queries) == 3
        with pytest.raises(FormatError, match=r"at most 3 \(format_options\.max_base\)"):
            parse_step(step + "<base-query>q</base-query>", "multi_query")
        server = _policy_renderer(RewardConfig(step_format="multi_query", policy_tokenizer=str(tokenizer)))
        assert (server.format.max_base, server.format.max_predicted) == (fmt.max_base, fmt.max_predicted)
        reward = top_survivor_config()
        assert (reward.survivors_base, reward.survivors_predicted) == (3, 1) and reward.alpha == 0.2
        tree = get_method("rrt", None).settings()["tree"]
        assert {name: tree[name] for name in numbers} == expected
    finally:
        monkeypatch.undo()
        r2ag_agent.cache_clear()


def test_the_progressive_driver_reads_the_recipe():
    from r3_env.train.config import SECTIONS
    from r3_env.train.local import LocalTrainConfig
    from r3_env.train.progressive import ProgressiveConfig, ProgressiveTrainer

    recipe = load_recipe("r2ag")
    args = argparse.Namespace(config=str(recipe.path))
    setattr(args, "model.policy", "policy0")  # r3rag r2ag train --config recipes/r2ag.yaml --model.policy policy0
    sections = [("r2ag.", ProgressiveConfig), *SECTIONS]
    _, *values = configs_from_args(args, sections, ignored=LAUNCH_SECTIONS)
    settings = LocalTrainConfig.from_sections(*values)
    assert settings.rollout == recipe.rollout_config()
    ProgressiveTrainer(ProgressiveConfig(prompts="p.jsonl"), settings)  # a one-step multi_query recipe


def test_bad_recipes_name_the_file_and_the_key(tmp_path, capsys):
    with pytest.raises(ConfigError, match="no recipe named 'frugal'.*known: lws, r2ag, r3"):
        load_recipe("frugal")
    bad = tmp_path / "bad.yaml"
    for text, message in [
        ("envs: {}\n", "unknown section 'envs'"),
        ("algo: {name: sac}\n", r"\(algo\): name must be one of"),
        ("algo: {batch: 3}\n", r"\(algo\): unknown key 'batch'"),
        ("env: {topk: -1}\n", r"\(env\)"),
        ("tree: {topk: 1}\n", r"\(tree\)"),
    ]:
        bad.write_text(text)
        with pytest.raises(ConfigError, match=message) as caught:
            load_recipe(bad)
        assert str(bad) in str(caught.value)
    assert main(["get", str(bad), "env.topk"]) == 2 and str(bad) in capsys.readouterr().err


def test_the_launch_helper_prints_settings_for_the_shell():
    run = [sys.executable, "-m", "r3_env.recipes"]
    shell = subprocess.run([*run, "shell", "r2ag"], capture_output=True, text=True, check=True).stdout
    lines = dict(line.split("=", 1) for line in shell.splitlines())
    assert lines["recipe_ALGO"] == "dapo" and shlex.split(lines["recipe_DYNAMIC_FILTERING_RANGE"]) == ["0 inf"]
    options = subprocess.run(
        [*run, "reward-options", "lws", '{"beta": 0.5}'], capture_output=True, text=True, check=True
    ).stdout
    assert json.loads(options) == {**load_recipe("lws").rollout_config().reward.options, "beta": 0.5}
    bad = subprocess.run([*run, "reward-options", "lws", "[1]"], capture_output=True, text=True)
    assert bad.returncode == 2 and "REWARD_OPTIONS" in bad.stderr
    staged = subprocess.run(
        [*run, "staged"],
        capture_output=True,
        text=True,
        env={**os.environ, "R3RAG_AGENT_CONFIG": str(ROOT / "recipes" / "lws.yaml")},
    )
    assert staged.stdout.strip() == "1"


def test_the_launch_scripts_hold_no_recipe_setting():
    """The RL scripts map variables to flags; a recipe's model or file written in one is a second copy."""
    settings = {f"configs/{name}.yaml" for name in RECIPES} | {load_recipe(name).algo.model for name in RECIPES}
    for script in [ROOT / "launch" / "ppo_r3.sh", *(ROOT / "launch").glob("dapo_*.sh"), ROOT / "launch" / "grpo_r3.sh"]:
        code = [line for line in script.read_text().splitlines() if not line.lstrip().startswith("#")]
        for line in code:
            assert not any(setting in line for setting in settings), f"{script.name}: {line}"
            assert "configs/" not in line or "reward_cpu" in line, f"{script.name}: {line}"


def test_the_real_question_demo_trains_r3_recall_as_measured():
    """REAL.rl is recipes/r3_recall.yaml's rules, reward and algorithm plus the local trainer's own levers: the
    --set list of the measured runs (docs/results.md, "Each search with the question's words"), so an edit to
    either file that changes the measured design fails here."""
    from demo.settings import REAL

    measured = {
        "model.lora_rank": 0, "model.trainable_layers": 8, "ppo.actor_lr": 2e-5, "ppo.init_kl_coef": 0.0,
        "ppo.estimator": "group_norm", "ppo.filter_groups": True, "ppo.train_batch_size": 4, "ppo.critic_warmup": 0,
        "ppo.temperature": 0.7, "reward.scheme": "r3_gold", "reward.placement": "scalar",
        "reward.options": {"no_answer_scale": 0.0, "correct_scale": 4.0, "wrong_scale": 2.0},
        "ppo.ptx_select": "failed", "ppo.ptx_coef": 1.0, "sft.lr": 5e-5, "ppo.prompt_filter": "missing_gold",
        "env.stop_after_action": True, "env.query_with_question": True,
    }  # fmt: skip
    typed = {key: (value, type(value)) for key, value in measured.items()}
    assert {key: (value, type(value)) for key, value in REAL.rl.items()} == typed
    recall = load_recipe("r3_recall")
    assert REAL.question_docs == recall.get("env.question_docs") == 4  # the cold start's rule too, so the demo's
    # on the cluster path: r3_gold's answers and gold passages in one field, as r3rag coldstart rl-data writes it
    assert recall.algo.label_key == "label" and not recall.algo.dynamic_filtering


def test_a_recipes_kl_coefficient_is_a_number_as_the_launch_script_reads_it():
    """kl_coef is a string so that "0" (no KL term, no reference model) differs from unset; ppo_r3.sh's
    require_number would refuse anything else later, on the cluster."""
    from r3_env.recipes import AlgoSection

    assert AlgoSection(kl_coef="0").variables() == {"KL_COEF": "0"} and AlgoSection().variables() == {}
    switched = AlgoSection(kl_coef="1e-3", dynamic_filtering=True)
    assert switched.variables() == {"KL_COEF": "1e-3", "DYNAMIC_FILTERING": "1"}
    for bad in ("inf", " 0.1", "-0.1", "x"):
        with pytest.raises(ValueError, match="kl_coef"):
            AlgoSection(kl_coef=bad)


def train_local_settings(*argv: str):
    """``r3rag train local ARGV``'s resolved settings, parsed as the command line parses them."""
    from r3_env.cli import build_parser
    from r3_env.train.cli import local_config

    return local_config(build_parser().parse_args(["train", "local", "--model.policy", "p", *argv]))


def test_train_local_runs_a_recipe_under_its_config_and_flags(tmp_path):
    """--recipe takes the recipe's agent sections as written and its algorithm's design (not its cluster budget);
    --config goes over it setting by setting, and flags over both."""
    recall = load_recipe("r3_recall")
    config = train_local_settings("--recipe", "r3_recall")
    assert config.rollout == recall.rollout_config()
    ppo = config.ppo
    assert (ppo.estimator, ppo.temperature, ppo.init_kl_coef, ppo.filter_groups) == ("group_norm", 0.7, 0.0, False)
    assert ppo.actor_lr == 2e-5 != recall.algo.actor_lr and ppo.rollout_batch_size == 16  # the local defaults
    lws = train_local_settings("--recipe", "lws")
    assert (lws.ppo.estimator, lws.ppo.eps_clip_high, lws.rollout.reward.scheme) == ("group_norm", 0.28, "lws")
    assert (lws.ppo.init_kl_coef, lws.ppo.filter_groups) == (1e-4, True)  # DAPO's KL default, dynamic sampling
    assert train_local_settings("--recipe", "r3").ppo.estimator == "gae"

    config_file = tmp_path / "train.yaml"
    config_file.write_text("env:\n  max_step_tokens: 128\nppo:\n  temperature: 0.9\n  n_samples_per_prompt: 4\n")
    config = train_local_settings("--recipe", "r3_recall", "--config", str(config_file), "--ppo.temperature", "1.0")
    assert (config.rollout.env.max_step_tokens, config.rollout.env.question_docs) == (128, 4)
    assert (config.ppo.temperature, config.ppo.n_samples_per_prompt, config.ppo.estimator) == (1.0, 4, "group_norm")


def test_a_schemes_options_merge_over_the_recipes_until_another_scheme_is_chosen(tmp_path):
    """As launch/ppo_r3.sh merges REWARD_OPTIONS over the recipe's: a file's and a flag's options go over the
    recipe's one by one while the scheme is the recipe's; another scheme starts from its own defaults."""
    recipe = load_recipe("r3_recall").rollout_config().reward.options  # no_answer_scale 0, the measured scales
    config_file = tmp_path / "train.yaml"
    config_file.write_text("reward:\n  options:\n    correct_scale: 3.0\n")
    merged = train_local_settings("--recipe", "r3_recall", "--config", str(config_file),
                                  "--reward.options", '{"wrong_scale": 1.5}').rollout.reward  # fmt: skip
    assert merged.options == {**recipe, "correct_scale": 3.0, "wrong_scale": 1.5} and merged.scheme == "r3_gold"
    other = train_local_settings("--recipe", "r3_recall", "--reward.scheme", "outcome").rollout.reward
    assert (other.scheme, other.options) == ("outcome", {})
    switched = train_local_settings("--recipe", "lws", "--config", str(config_file), "--reward.scheme", "r3")
    assert switched.rollout.reward.options == {}  # the file's options were for the recipe's scheme
    chosen = tmp_path / "chosen.yaml"  # a file that names its scheme: its options are that scheme's
    chosen.write_text("reward:\n  scheme: r3\n  options:\n    correct_scale: 3.0\n")
    assert train_local_settings("--recipe", "lws", "--config", str(chosen)).rollout.reward.options == {
        "correct_scale": 3.0
    }
    chosen.write_text("reward:\n  scheme: gold_hit\n  options:\n    correct_scale: 3.0\n")
    with pytest.raises(ValueError, match="reward scheme 'gold_hit'"):  # r3's option, not gold_hit's: before training
        train_local_settings("--config", str(chosen))


def test_layers_merge_options_against_the_default_scheme_and_json_text(tmp_path):
    """A lower layer that names no scheme runs the default one, so naming it above keeps its options; options
    written as JSON text (as a flag's are) merge like a mapping; flags merge over a file without a recipe too; an
    empty non-mapping section is refused, not read as no section."""
    from r3_env.train.config import layered

    lower = {"reward": {"options": {"correct_scale": 4.0}}, "env": {"topk": 3}}
    same = layered(lower, {"reward": {"scheme": "r3", "options": '{"wrong_scale": 2.0}'}})
    assert same["reward"] == {"scheme": "r3", "options": {"correct_scale": 4.0, "wrong_scale": 2.0}}
    assert layered(lower, {"reward": {"scheme": "lws"}})["reward"] == {"scheme": "lws"}
    assert layered(lower, {"env": {"topk": 5}}) == {"reward": lower["reward"], "env": {"topk": 5}}
    config_file = tmp_path / "train.yaml"
    config_file.write_text("reward:\n  options:\n    correct_scale: 3.0\n")
    flagged = train_local_settings("--config", str(config_file), "--reward.options", '{"wrong_scale": 1.5}')
    assert flagged.rollout.reward.options == {"correct_scale": 3.0, "wrong_scale": 1.5}
    config_file.write_text("reward: []\n")
    with pytest.raises(ConfigError, match="'reward' must be a mapping"):
        train_local_settings("--recipe", "r3_recall", "--config", str(config_file))


def test_train_local_refuses_a_recipe_as_config_and_what_it_cannot_run(tmp_path):
    with pytest.raises(ConfigError, match="is a recipe .* give it as --recipe"):
        train_local_settings("--config", str(ROOT / "recipes" / "lws.yaml"))
    with pytest.raises(ConfigError, match="progressive rounds .* r3rag r2ag train --config"):
        train_local_settings("--recipe", "r2ag")
    recipe = tmp_path / "frugal.yaml"
    recipe.write_text((ROOT / "recipes" / "r3.yaml").read_text().replace("name: ppo ", "name: reinforce++ "))
    assert load_recipe(recipe).algo.name == "reinforce++"
    with pytest.raises(
        ConfigError, match="algo.name 'reinforce\\+\\+' has no local estimator.*give a copy of the recipe"
    ):
        train_local_settings("--recipe", str(recipe))
