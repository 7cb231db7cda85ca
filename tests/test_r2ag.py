"""R2AG on the house: the retrieval tree (expansion, Top-Survivor, pruning, metrics) over a real BM25
index, and the progressive driver's rounds with the local trainer against the real retrieval service."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
import re

import pytest
import yaml
from conftest import ServiceProcess

from r3_env.data import iter_corpus, iter_jsonl, read_dataset
from r3_env.protocol import Step, get_format
from r3_env.recipes import load_recipe
from r3_env.retrieval import load_retriever
from r3_env.retrieval.config import RetrieverConfig
from r3_env.retrieval.index_builder import IndexBuildConfig, build_index
from r3_env.rollout_config import ServicesConfig
from r3_env.tree import Tree, expand_tree, gold_documents, oracle_steerer, prune_to_gold, tree_metrics
from r3_env.world.build import WorldConfig, generate_world

FORMAT = get_format("multi_query")
R2AG = load_recipe("r2ag")


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("r2ag")
    generate_world(WorldConfig(entities=150, seed=11, bm25_check=0), root / "world")
    index = build_index(IndexBuildConfig(corpus_path=str(root / "world" / "corpus.jsonl"), save_dir=str(root / "idx")))
    (root / "retriever.yaml").write_text(yaml.safe_dump({"retrieval_method": "bm25", "index_path": str(index)}))
    retriever = load_retriever(RetrieverConfig(retrieval_method="bm25", index_path=str(index)))
    items = [i for i in read_dataset(root / "world" / "train.jsonl") if i.metadata["hops"] == 2]
    passages = {p.id: p for p in iter_corpus(root / "world" / "corpus.jsonl")}
    yield {"root": root, "retriever": retriever, "items": items, "passages": passages}
    retriever.close()


class CountingSearch:
    """The in-process BM25 retriever, counting batched calls (one per tree iteration is the contract)."""

    def __init__(self, retriever) -> None:
        self.retriever, self.calls = retriever, []

    async def __call__(self, queries, k):
        self.calls.append(list(queries))
        return self.retriever.search(list(queries), k)


def plans(items) -> dict:
    return {i.question: [(h["question"], h["passage_id"]) for h in i.metadata["question_decomposition"]] for i in items}


def grow(world, item, steer, config=None, context=()):
    search = CountingSearch(world["retriever"])
    gold = item.metadata["supporting_passage_ids"]
    config = config or R2AG.tree_config()
    tree = asyncio.run(expand_tree(item.question, steer, search, FORMAT, config, gold_ids=gold, context=context))
    return tree, search


def test_an_oracle_steered_tree_finds_the_gold_hop_by_hop_with_one_batched_retrieval_per_iteration(world):
    found_all = 0
    for item in world["items"][:10]:
        tree, search = grow(world, item, oracle_steerer(plans([item]), FORMAT, hops_per_step=1))
        assert len(search.calls) == tree.iterations - (tree.vertices[-1].depth < tree.iterations)
        assert all(len(batch) >= 1 for batch in search.calls)
        metrics = tree_metrics(tree)
        gold = set(item.metadata["supporting_passage_ids"])
        retrieved = [p.id for p in tree.retrieved()]
        assert metrics["num_docs"] == len(retrieved) == len(set(retrieved))
        assert metrics["recall"] == len(gold & set(retrieved)) / len(gold)
        found_all += metrics["full_recall"] == 1.0
        # every vertex's new gold is gold, first retrieved there
        firsts = [g for v in tree.vertices for g in v.new_gold]
        assert len(firsts) == len(set(firsts)) and set(firsts) <= gold
        if tree.complete:  # the oracle stops alone once nothing is missing
            assert any(v.stop and v.expanded for v in tree.vertices)
    assert found_all >= 7  # BM25 finds most single-hop sub-questions' passages at top-1


def test_top_survivor_keeps_the_first_t_queries_in_the_order_written(world):
    item = world["items"][0]
    queries = ("birthplace of Marta Kell", *(h["question"] for h in item.metadata["question_decomposition"]))

    async def steer(question, context):
        if context:
            return FORMAT.render_step(Step("Enough.", stop=True))
        return FORMAT.render_step(Step("Three queries.", queries=queries[:3], predicted=(queries[0], queries[1])))

    tree, search = grow(world, item, steer, R2AG.tree_config(survivors_base=2, survivors_predicted=1))
    children = [v for v in tree.vertices if v.depth == 1]
    assert [v.kind for v in children] == ["base", "base", "base", "predicted", "predicted"]
    assert [v.survived for v in children] == [True, True, False, True, False]
    assert search.calls[0] == [v.query for v in children]  # one batched request for the whole iteration
    # survivors with new documents were expanded; the third base query and the second predicted were not
    expanded = {v.id for v in tree.vertices if v.expanded}
    assert children[2].id not in expanded and children[4].id not in expanded
    assert tree.iterations == 2 and all(v.stop for v in tree.vertices if v.expanded and v.depth == 1)


def test_a_broken_step_or_a_stop_ends_its_branch_and_the_record_round_trips(world):
    item = world["items"][1]

    async def steer(question, context):
        return "<think>no queries here" if not context else FORMAT.render_step(Step("x", stop=True))

    tree, search = grow(world, item, steer)
    assert tree.root.format_error == "unclosed_tag" and len(tree.vertices) == 1 and search.calls == []
    assert tree_metrics(tree)["num_docs"] == 0 and not tree.complete
    again = Tree.from_json(json.loads(json.dumps(tree.to_json())))
    assert again.to_json() == tree.to_json()


def test_pruning_keeps_the_gold_branches_and_the_next_context_is_exactly_the_gold_found(world):
    item = world["items"][2]
    hops = item.metadata["question_decomposition"]
    distractor = next(p for pid, p in world["passages"].items() if pid not in item.metadata["supporting_passage_ids"])

    async def steer(question, context):
        if context and len(context) > 1:
            return FORMAT.render_step(Step("Done.", stop=True))
        return FORMAT.render_step(Step("Both.", queries=(hops[0]["question"], distractor.title + " overview")))

    tree, _ = grow(world, item, steer, R2AG.tree_config(max_iterations=2))
    kept = prune_to_gold(tree)
    assert kept[0] is tree.root
    for vertex in kept[1:]:  # each kept vertex found gold itself or lies above a vertex that did
        below = [v for v in tree.vertices if vertex in tree.path(v)]
        assert any(v.new_gold for v in below)
    context = gold_documents(tree)
    assert [p.id for p in context] == tree.gold_found()
    assert set(tree.gold_found()) <= set(item.metadata["supporting_passage_ids"])
    # a tree started from a context counts its gold as found and never re-reports it as new
    started = [world["passages"][hops[0]["passage_id"]], distractor]
    tree2, _ = grow(world, item, steer, R2AG.tree_config(max_iterations=1), context=started)
    assert hops[0]["passage_id"] in tree2.gold_found()
    assert all(hops[0]["passage_id"] not in v.new_gold for v in tree2.vertices)
    assert [p.id for p in gold_documents(tree2)][0] == hops[0]["passage_id"]
    assert distractor.id not in {p.id for p in gold_documents(tree2)}


# -- the progressive driver ------------------------------------------------------------------------


def test_the_progressive_driver_runs_two_rounds_and_carries_exactly_the_gold_found(world, tmp_path, bpe_backend):
    from r3_env.config import configs_from_values
    from r3_env.train.config import SECTIONS
    from r3_env.train.local import LocalTrainConfig
    from r3_env.train.model_factory import TinyModelConfig, build_tiny_policy
    from r3_env.train.progressive import ProgressiveConfig, ProgressiveTrainer

    tiny = TinyModelConfig(vocab_size=600, hidden_size=32, layers=1, heads=2, kv_heads=1, intermediate_size=64)
    policy = build_tiny_policy(world["root"] / "world", tmp_path / "policy0", tiny)
    # four questions; two start from a context of one gold passage and one distractor (a warm start)
    items = world["items"][:4]
    rows = []
    for number, item in enumerate(items):
        row = item.to_json()
        if number < 2:
            gold = world["passages"][item.metadata["supporting_passage_ids"][0]]
            other = next(p for p in world["passages"].values() if p.id not in item.metadata["supporting_passage_ids"])
            row["metadata"]["start_documents"] = [gold.to_json(), other.to_json()]
        rows.append(row)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with ServiceProcess(["retriever", "serve", "--config", str(world["root"] / "retriever.yaml")]) as retriever:
        values = copy.deepcopy(R2AG.agent)
        values.update(
            {
                "seed": 5,
                "device": "cpu",
                "model": {"policy": str(policy)},
                "ppo": {
                    "iterations": 1,
                    "rollout_batch_size": 2,
                    "n_samples_per_prompt": 2,
                    "micro_batch_size": 2,
                    "train_batch_size": 4,
                    "estimator": "group_norm",
                    "init_kl_coef": 0.0,
                    "max_len": 1024,
                },
            }
        )
        values["env"]["max_step_tokens"] = 48
        values["services"] = {"retriever_url": retriever.url}
        settings = LocalTrainConfig.from_sections(*configs_from_values(values, SECTIONS))
        config = ProgressiveConfig(prompts=str(prompts), out=str(tmp_path / "r2ag"), rounds=2)
        ProgressiveTrainer(config, settings).run()
        out = tmp_path / "r2ag"
        first = json.loads((out / "round1" / "done.json").read_text())
        assert first["prompts"] == 4 and (out / "round1" / "train" / "ppo" / "policy").is_dir()
        trees = {row["id"]: Tree.from_json(row["tree"]) for _, row in iter_jsonl(out / "round1" / "trees.jsonl")}
        second = {row["id"]: row for _, row in iter_jsonl(out / "round2" / "prompts.jsonl")}
        assert set(second) == {i for i, t in trees.items() if not t.complete}
        for qid, row in second.items():  # the context is exactly the gold documents round one holds
            tree = trees[qid]
            held = {p.id for v in tree.vertices for p in v.documents} & set(tree.gold_ids)
            assert [d["id"] for d in row["metadata"]["start_documents"]] == [p.id for p in gold_documents(tree)]
            assert {d["id"] for d in row["metadata"]["start_documents"]} == held
        warm = {row["id"]: [d["id"] for d in row["metadata"]["start_documents"]] for row in rows[:2]}
        for qid, (gold, distractor) in warm.items():  # the warm start's gold carries over, its distractor not
            if qid in second:
                ids = [d["id"] for d in second[qid]["metadata"]["start_documents"]]
                assert ids[0] == gold and distractor not in ids
        assert any(qid in second for qid in warm)  # a one-hop warm start does not complete a two-hop tree alone
        assert json.loads((out / "round2" / "done.json").read_text())["round"] == 2
        # a rerun finds both rounds done and trains nothing
        assert ProgressiveTrainer(config, settings).run() == first["policy"].replace("round1", "round2")


# -- cold start: expansion-step SFT data ----------------------------------------------------------


def test_sft_data_in_the_multi_query_format_has_one_example_per_step_with_the_documents_found_before(
    world, tmp_path, chat_tokenizers
):
    from r3_env.coldstart.sft_data import SFTDataConfig, build_sft_data

    item = world["items"][3]
    hops = item.metadata["question_decomposition"]
    docs = [world["passages"][h["passage_id"]] for h in hops]
    row = {
        "id": item.id,
        "question": item.question,
        "outcome": "correct",
        "steps": [
            {"analysis": f"Hop {i + 1} is missing.", "query": h["question"], "documents": [d.to_json()]}
            for i, (h, d) in enumerate(zip(hops, docs, strict=True))
        ]
        + [{"analysis": "Both facts are in.", "answer": item.golden_answers[0]}],
    }
    source = tmp_path / "trajectories.jsonl"
    source.write_text(json.dumps(row) + "\n")
    stats = build_sft_data(SFTDataConfig(input=str(source), out=str(tmp_path / "sft.jsonl"), step_format="multi_query"))
    assert stats["trajectories"] == 1 and stats["examples"] == 3
    rows = [r for _, r in iter_jsonl(tmp_path / "sft.jsonl")]
    for number, example in enumerate(rows):
        messages = example["messages"]
        assert [m["role"] for m in messages] == ["system", "user", "assistant"]
        user = messages[1]["content"]
        assert FORMAT.find_question(user) == item.question
        shown = re.findall(r"^\[\d+\] (.*)$", user, re.MULTILINE)
        assert shown == [d.title for d in docs[:number]]  # the documents found by the earlier steps, no others
        step = FORMAT.parse_step(messages[2]["content"])
        if number < len(hops):
            assert step.queries == (hops[number]["question"],) and not step.stop
        else:
            assert step.stop and not step.searches  # the answer becomes the stop signal
    # with a tokenizer, the examples are measured and a template check runs
    tokenizer_dir = tmp_path / "tok"
    chat_tokenizers[0][1].save_pretrained(tokenizer_dir)  # ChatML on a BPE
    stats = build_sft_data(
        SFTDataConfig(
            input=str(source), out=str(tmp_path / "sft2.jsonl"), step_format="multi_query", tokenizer=str(tokenizer_dir)
        )
    )
    assert stats["examples"] == 3 and stats["tokens"]["max"] > 0


def test_the_openrlhf_trainer_gets_each_rounds_prompts_policy_and_folder(world, tmp_path):
    """``r2ag.trainer openrlhf`` with a stand-in for launch/dapo_r2ag.sh (a Ray job needs GPUs): the stand-in
    records its variables and saves the policy it was given as the round's model, so expansion runs for real."""
    from r3_env.config import configs_from_values
    from r3_env.train.config import SECTIONS
    from r3_env.train.local import LocalTrainConfig
    from r3_env.train.model_factory import TinyModelConfig, build_tiny_policy
    from r3_env.train.progressive import ProgressiveConfig, ProgressiveTrainer

    tiny = TinyModelConfig(vocab_size=600, hidden_size=32, layers=1, heads=2, kv_heads=1, intermediate_size=64)
    policy = build_tiny_policy(world["root"] / "world", tmp_path / "policy0", tiny)
    job = tmp_path / "job.sh"
    job.write_text(
        'echo "$ROUND $PROMPT_DATA $POLICY $SAVE_DIR" >> "$(dirname "$0")/calls.txt"\n'
        'mkdir -p "$SAVE_DIR" && cp -r "$POLICY"/. "$SAVE_DIR"/\n'
    )
    items = world["items"][4:7]
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(i.to_json()) + "\n" for i in items))
    with ServiceProcess(["retriever", "serve", "--config", str(world["root"] / "retriever.yaml")]) as retriever:
        values = copy.deepcopy(R2AG.agent)
        values.update({"device": "cpu", "model": {"policy": str(policy)}})
        values["env"]["max_step_tokens"] = 32
        values["services"] = {"retriever_url": retriever.url}
        settings = LocalTrainConfig.from_sections(*configs_from_values(values, SECTIONS))
        out = tmp_path / "r2ag"
        config = ProgressiveConfig(
            prompts=str(prompts), out=str(out), rounds=2, trainer="openrlhf", launch_script=str(job)
        )
        final = ProgressiveTrainer(config, settings).run()
    calls = [line.split() for line in (tmp_path / "calls.txt").read_text().splitlines()]
    assert calls[0] == ["1", str(out / "round1" / "prompts.jsonl"), str(policy), str(out / "round1" / "train")]
    if len(calls) == 2:  # the tiny random policy rarely completes a tree: round 2 trains from round 1's model
        assert calls[1] == ["2", str(out / "round2" / "prompts.jsonl"), calls[0][3], str(out / "round2" / "train")]
        assert final == calls[1][3]
    assert len(list(iter_jsonl(out / "round1" / "trees.jsonl"))) == 3
    # the last round still writes the next prompts, so a rerun with more rounds goes on from there
    done = json.loads((out / "round2" / "done.json").read_text())
    if done["next_prompts"]:
        assert len(list(iter_jsonl(out / "round3" / "prompts.jsonl"))) == done["next_prompts"]
        with ServiceProcess(["retriever", "serve", "--config", str(world["root"] / "retriever.yaml")]) as retriever:
            more = dataclasses.replace(
                settings, rollout=dataclasses.replace(settings.rollout, services=ServicesConfig(retriever.url))
            )
            ProgressiveTrainer(dataclasses.replace(config, rounds=3), more).run()
        rounds = [line.split()[0] for line in (tmp_path / "calls.txt").read_text().splitlines()]
        assert rounds == ["1", "2", "3"]  # rounds 1 and 2 are not trained again


def test_the_driver_refuses_malformed_start_documents_naming_the_question(world):
    from r3_env.train.progressive import first_round_prompts

    item = world["items"][0]
    bad = dataclasses.replace(item, metadata={**item.metadata, "start_documents": {"title": ["x"]}})
    with pytest.raises(ValueError, match=f"{item.id}.*start_documents"):
        first_round_prompts([bad])


def test_the_demo_model_factory_learns_the_multi_query_markers(world, tmp_path):
    from transformers import AutoTokenizer

    from r3_env.train.model_factory import TinyModelConfig, build_tiny_policy

    sizes = TinyModelConfig(vocab_size=600, hidden_size=32, layers=1, heads=2, kv_heads=1, step_format="multi_query")
    tokenizer = AutoTokenizer.from_pretrained(build_tiny_policy(world["root"] / "world", tmp_path / "p", sizes))
    step = FORMAT.render_step(Step("a", queries=("b",), predicted=("c",), stop=True))
    # the markers' words are learnt whole (byte-level pre-tokenisation keeps "<", "-" and ">" apart)
    tokens = [token.lstrip("Ġ") for token in tokenizer.tokenize(step)]
    assert {"think", "base", "query", "predicted", "stop", "retrieval"} <= set(tokens)


def test_branches_that_meet_go_on_from_their_joint_path_once(world):
    """Gold A, B, C; C is asked for only once A and B are both on the path. The root asks for A and B;
    A's branch then finds B and B's branch A (each new to its own path, not to the tree): the two paths
    are the same, so one of them goes on, and finds C."""
    retriever = world["retriever"]
    titled = [p for p in world["passages"].values() if retriever.search([p.title], 1)[0][0].passage.id == p.id]
    a, b, c = titled[:3]

    async def steer(question, context):
        have = {p.id for p in context}
        if have == {a.id}:
            return FORMAT.render_step(Step("B next.", queries=(b.title,)))
        if have == {b.id}:
            return FORMAT.render_step(Step("A next.", queries=(a.title,)))
        if have == {a.id, b.id}:
            return FORMAT.render_step(Step("Now C.", queries=(c.title,)))
        if have == {a.id, b.id, c.id}:
            return FORMAT.render_step(Step("All found.", stop=True))
        return FORMAT.render_step(Step("A and B first.", queries=(a.title, b.title)))

    search = CountingSearch(retriever)
    tree = asyncio.run(expand_tree("q", steer, search, FORMAT, R2AG.tree_config(), gold_ids=[a.id, b.id, c.id]))
    assert tree.complete and tree_metrics(tree)["full_recall"] == 1.0
    level2 = [v for v in tree.vertices if v.depth == 2]
    assert len(level2) == 2 and sum(v.expanded for v in level2) == 1  # equal paths {A, B}: expanded once
    assert search.calls[2] == [c.title]


def test_the_multi_query_format_is_refused_where_episodes_are_conversations_or_judged(chat_tokenizers):
    from eval.run import EvalRunConfig
    from r3_env.coldstart.synth import SynthConfig
    from r3_env.config import ConfigError
    from r3_env.rollout_config import RolloutConfig
    from r3_env.rollout_context import RolloutContext

    with pytest.raises(ValueError, match="--method rrt"):
        EvalRunConfig(data="d.jsonl", step_format="multi_query")
    with pytest.raises(ValueError, match="sft-data --step_format multi_query"):
        SynthConfig(data="d.jsonl", step_format="multi_query")
    for scheme in ("r3", "lws", "outcome"):
        config = RolloutConfig.from_dict({"policy": {"step_format": "multi_query"}, "reward": {"scheme": scheme}})
        with pytest.raises(ConfigError, match="top_survivor"):
            RolloutContext(config, chat_tokenizers[0][1])
