"""The episode, the rollout loop and the OpenRLHF agent, against real services on real ports.

The engine is :class:`r3_env.engines.HFEngine` over a tiny random Qwen2: it honours OpenRLHF's
``llm_engine.generate(token_ids, sampling_params)`` contract. Scripted trajectories force its
token choices (constrained decoding; every forward pass is real) so each outcome type is known.
The retrieval service serves a BM25 index of a synthetic world; the reward server uses the
lexical judge (no model), whose scores the tests read back from ``/relevance`` itself.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import numpy as np
import pytest
import yaml
from conftest import (
    CHATML_TEMPLATE,
    Script,
    ServiceProcess,
    answer_step,
    make_tokenizer,
    minilm_path,
    query_step,
    save_tiny_causal_lm,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from r3_env.data import Passage
from r3_env.engines import HFEngine, SamplingParams
from r3_env.env import EnvConfig, RetrievalEnv, StepKind
from r3_env.protocol import ChatRenderer, Step, get_format
from r3_env.recipes import agent_config_from_environment, load_recipe
from r3_env.retrieval.base import Hit
from r3_env.retrieval.encoder import Encoder
from r3_env.retrieval.index_builder import IndexBuildConfig, build_index
from r3_env.rewards import is_concise
from r3_env.rollout import run_episode
from r3_env.rollout_config import EpisodeRewardConfig, RolloutConfig, ServicesConfig
from r3_env.rollout_context import RolloutContext
from r3_env.world.build import WorldConfig, generate_world

# -- fixtures: a world, its BM25 service, the reward server, a tiny policy ----------------------------


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("rollout")
    generate_world(WorldConfig(entities=200, seed=3, bm25_check=0), root / "world")
    rows = [json.loads(line) for line in (root / "world" / "dev.jsonl").read_text().splitlines()]
    two_hop = [r for r in rows if r["metadata"]["hops"] == 2][:8]
    index = build_index(IndexBuildConfig(corpus_path=str(root / "world" / "corpus.jsonl"), save_dir=str(root / "idx")))
    return {"root": root, "rows": two_hop, "index": index}


@pytest.fixture(scope="module")
def retriever(world):
    path = world["root"] / "retriever.yaml"
    path.write_text(yaml.safe_dump({"retrieval_method": "bm25", "index_path": str(world["index"])}))
    with ServiceProcess(["retriever", "serve", "--config", str(path)]) as service:
        yield service


@pytest.fixture(scope="module")
def reward(world):
    path = world["root"] / "reward.yaml"
    path.write_text(yaml.safe_dump({"judge": {"backend": "lexical"}}))
    with ServiceProcess(["reward", "serve", "--config", str(path)]) as service:
        yield service


@pytest.fixture(scope="module")
def tokenizer(bpe_backend):
    return make_tokenizer(bpe_backend, CHATML_TEMPLATE)


@pytest.fixture(scope="module")
def model(tokenizer, tmp_path_factory):
    from transformers import AutoModelForCausalLM

    folder = save_tiny_causal_lm(tmp_path_factory.mktemp("policy"), tokenizer)
    return AutoModelForCausalLM.from_pretrained(folder)


def hops(row) -> list[str]:
    return [d["question"] for d in row["metadata"]["question_decomposition"]]


def config(retriever, judge, **sections) -> RolloutConfig:
    values = {"services": {"retriever_url": retriever.url, "reward_url": judge.url, "backoff_s": 0.05}}
    for name, section in sections.items():
        values.setdefault(name, {}).update(section)
    return RolloutConfig.from_dict(values)


def run(coro):
    return asyncio.run(coro)


async def relevance_of(reward, question: str, analysis: str, query: str, documents: list[str]) -> float:
    async with httpx.AsyncClient() as client:
        body = {"items": [{"question": question, "analysis": analysis, "query": query, "documents": documents}]}
        response = await client.post(reward.url + "/relevance", json=body)
        return response.json()["results"][0]["score"]


# -- the episode on its own ----------------------------------------------------------------------------


class FixedSearch:
    """An in-process search: the same five passages for any query (the episode's bookkeeping is under test)."""

    def __init__(self) -> None:
        self.passages = [Passage(str(i), f"Title {i}\nText {i}.") for i in range(5)]
        self.queries: list[str] = []

    async def __call__(self, query: str, k: int) -> list[Hit]:
        self.queries.append(query)
        return [Hit(p, 1.0) for p in self.passages[:k]]


def test_env_keeps_new_documents_per_step_and_caps_the_total_as_the_official_code(tokenizer):
    renderer = ChatRenderer(tokenizer)
    search = FixedSearch()
    env = RetrievalEnv(EnvConfig(dedup_docs=True, docs_per_step=2, max_total_docs=5), renderer, search, "Q?")
    assert env.reset() == renderer.prompt("Q?")
    shown = []
    for _ in range(3):
        result = run(env.step(query_step("a", "q")))
        shown.append([p.id for p in result.documents])
        assert "Retrieved documents for step" in result.feedback
    assert shown == [["0", "1"], ["2", "3"], ["4"]]
    assert env.num_docs == 5
    result = run(env.step(answer_step("done", "X")))
    assert result.done and env.answer == "X" and env.retrievals == 3


def test_env_retrieves_with_the_question_first_and_shows_it_before_the_first_step(tokenizer):
    """env.question_docs: the question's own top documents come with the prompt, count as shown and as found."""
    renderer = ChatRenderer(tokenizer)
    search = FixedSearch()
    config = EnvConfig(dedup_docs=True, docs_per_step=2, max_total_docs=5, question_docs=2)
    env = RetrievalEnv(config, renderer, search, "Q?")
    with pytest.raises(RuntimeError, match="await start"):
        run(env.step(query_step("a", "q")))
    prompt = run(env.start())
    assert prompt == renderer.prompt("Q?", search.passages[:2]) and "Text 1." in prompt
    assert search.queries == ["Q?"] and [p.id for p in env.question_documents] == ["0", "1"]
    shown = run(env.step(query_step("a", "q"))).documents
    assert [p.id for p in shown] == ["2", "3"]  # the question's are not shown again
    assert env.num_docs == 4 and env.retrievals == 1
    assert run(env.step(query_step("b", "q2"))).documents == (search.passages[4],)  # the cap counts them too
    progress = env.gold_progress(["1", "3"])  # gold the question found is nobody's step's
    assert (progress.before, progress.new) == (1, [1, 0])
    with pytest.raises(RuntimeError, match="has started"):
        run(env.start())
    with pytest.raises(ValueError, match="question_docs"):
        EnvConfig(question_docs=-1)


def test_env_ends_without_answer_at_max_steps_and_never_shows_the_last_documents(tokenizer):
    env = RetrievalEnv(EnvConfig(max_steps=2), ChatRenderer(tokenizer), FixedSearch(), "Q?")
    assert not run(env.step(query_step("a", "q1"))).done
    last = run(env.step(query_step("b", "q2")))
    assert last.done and last.feedback == "" and env.answer is None and env.format_error is None
    with pytest.raises(RuntimeError, match="episode is over"):
        run(env.step(answer_step("c", "X")))


def test_env_answer_at_limit_shows_the_last_documents_and_starts_the_answer_step(tokenizer):
    config = EnvConfig(max_steps=2, answer_at_limit=True, format_retries=1)
    renderer = ChatRenderer(tokenizer)
    env = RetrievalEnv(config, renderer, FixedSearch(), "Q?")
    prefix = renderer.format.answer_prefix()
    assert prefix.endswith("The final answer:") and env.answer_prefix == ""
    assert not run(env.step(query_step("a", "q1"))).feedback.endswith(prefix)
    last = run(env.step(query_step("b", "q2")))  # the limit: its documents are shown, the answer step begun
    assert not last.done and last.feedback.endswith(prefix) and "Text 0." in last.feedback
    assert env.answer_prefix == prefix and env.num_docs == 10
    assert run(env.step(" X\nThe retrieval query: q3")).retry  # malformed: written again after the same prefix
    assert env.answer_prefix == prefix
    assert run(env.step(" X")).done and env.answer == "X" and env.answer_prefix == ""
    assert env.steps[-1].action == prefix + " X" and env.retrievals == 2
    with pytest.raises(ValueError, match="multi_query format cannot write an answer step"):
        RetrievalEnv(config, ChatRenderer(tokenizer, "multi_query"), FixedSearch(), "Q?")


def test_env_stop_after_action_ends_a_step_with_its_query_or_answer(tokenizer):
    """A step that writes an answer after its query searches, as if a stop had ended it at the query's line."""
    renderer = ChatRenderer(tokenizer)
    both = query_step("a", "q1") + "\nThe final answer: X"
    plain = RetrievalEnv(EnvConfig(), renderer, FixedSearch(), "Q?")
    assert run(plain.step(both)).done and plain.format_error == "both_query_and_answer"
    config = EnvConfig(max_steps=2, answer_at_limit=True, stop_after_action=True)
    env = RetrievalEnv(config, renderer, FixedSearch(), "Q?")
    assert env.action_end(both) == len(query_step("a", "q1")) and env.action_end(query_step("a", "q1")) is None
    first = run(env.step(both))
    assert not first.done and env.steps[0].action == query_step("a", "q1") and env.steps[0].step.query == "q1"
    assert first.feedback.startswith(renderer.frame.turn_end)  # the turn is closed for the cut step
    cut_off = query_step("b", "q2") + "\nThe final answer: and on and on"  # hit the token limit after its query
    assert not run(env.step(cut_off, closed=False)).done and env.steps[1].step.query == "q2"
    assert env.action_end(" Y\nThe retrieval query: q3") == 2  # after the answer step the environment began
    assert run(env.step(" Y\nThe retrieval query: q3")).done and env.answer == "Y"


def test_env_regenerates_a_malformed_step_up_to_format_retries_then_fails(tokenizer):
    env = RetrievalEnv(EnvConfig(format_retries=2), ChatRenderer(tokenizer), FixedSearch(), "Q?")
    assert run(env.step("garbage")).retry
    assert run(env.step("more garbage")).retry
    final = run(env.step("still garbage"))
    assert final.done and env.format_error == "missing_analysis"
    assert env.steps[-1].format_retries == 2
    truncated = RetrievalEnv(EnvConfig(format_retries=2), ChatRenderer(tokenizer), FixedSearch(), "Q?")
    assert run(truncated.step(query_step("a", "q"), closed=False)).done  # a cut-off step is not regenerated
    assert truncated.format_error == "truncated"


def test_a_reasoning_models_think_block_gets_its_own_budget_and_is_not_part_of_the_step(tokenizer):
    config = EnvConfig(max_step_tokens=96, think_tokens=400)
    assert config.step_budget == 496 and EnvConfig().step_budget == 512
    env = RetrievalEnv(config, ChatRenderer(tokenizer), FixedSearch(), "Q?")
    run(env.step("<think>\nWhich film? I should look it up.\n</think>\n\n" + query_step("a", "q")))
    assert env.steps[0].step.analysis == "a" and env.steps[0].step.query == "q"
    cut = RetrievalEnv(config, ChatRenderer(tokenizer), FixedSearch(), "Q?")  # the budget ran out while thinking
    assert run(cut.step("<think>\nStill thinking when", closed=False)).done and cut.format_error == "truncated"
    unclosed = RetrievalEnv(config, ChatRenderer(tokenizer), FixedSearch(), "Q?")  # it ended its turn inside one
    assert run(unclosed.step("<think>\nI will stop here")).done and unclosed.format_error == "unclosed_tag"
    with pytest.raises(ValueError, match="think_tokens"):
        EnvConfig(think_tokens=-1)


def test_env_closes_the_turn_for_a_step_that_stopped_on_another_token(tokenizer):
    renderer = ChatRenderer(tokenizer)
    env = RetrievalEnv(EnvConfig(), renderer, FixedSearch(), "Q?")
    result = run(env.step(query_step("a", "q"), closed=True, turn_ended=False))
    assert result.feedback.startswith(renderer.frame.turn_end)
    assert run(RetrievalEnv(EnvConfig(), renderer, FixedSearch(), "Q?").step(query_step("a", "q"))).feedback == (
        renderer.observation(FixedSearch().passages, 1)
    )


def test_a_malformed_retrieval_answer_is_a_service_error():
    from r3_env.retrieval.client import RetrievalServiceError, _parse

    with pytest.raises(RetrievalServiceError, match="lacks document"):
        _parse({"result": [[{"document": {"id": "1"}}]]}, 1)


def test_env_cuts_huge_queries_before_retrieval(tokenizer):
    search = FixedSearch()
    env = RetrievalEnv(EnvConfig(max_query_chars=50), ChatRenderer(tokenizer), search, "Q?")
    run(env.step(query_step("a", "x" * 5000)))
    assert search.queries == ["x" * 50]
    assert env.steps[0].step.query == "x" * 5000  # the record keeps what the policy wrote


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(max_size=400), closed=st.booleans())
def test_fuzz_any_model_output_is_a_step_result_never_an_exception(tokenizer, text, closed):
    env = RetrievalEnv(EnvConfig(format_retries=1), ChatRenderer(tokenizer), FixedSearch(), "Q?")
    result = run(env.step(text, closed=closed))
    assert result.retry or result.done or result.feedback
    if result.done and env.steps:
        assert env.steps[-1].kind in (StepKind.ANSWER, StepKind.FORMAT_ERROR, StepKind.QUERY)


# -- scripted rollouts through the real services -------------------------------------------------------


def scripted_engine(model, tokenizer, context: RolloutContext) -> tuple[HFEngine, Script]:
    script = Script(tokenizer)
    return HFEngine(model, tokenizer, max_batch=16, script=script), script


def test_every_outcome_type_gets_the_r3_rewards_at_the_right_tokens(world, retriever, reward, tokenizer, model):
    rows = world["rows"]

    async def main():
        ctx = RolloutContext(config(retriever, reward), tokenizer)
        engine, script = scripted_engine(model, tokenizer, ctx)
        first, second = hops(rows[0])
        gold = rows[0]["golden_answers"][0]
        script.plans = {
            rows[0]["question"]: [
                query_step("first hop", first),
                query_step("second", second),
                answer_step("ok", gold),
            ],
            rows[1]["question"]: [query_step("look", hops(rows[1])[0]), answer_step("guess", "Nobody Atall")],
            rows[2]["question"]: [query_step("loop", hops(rows[2])[0])],  # never answers
            rows[3]["question"]: [query_step("look", hops(rows[3])[0]), "I refuse to use the format."],
        }
        params = SamplingParams(temperature=1.0, max_tokens=None)
        results = await asyncio.gather(
            *(run_episode(ctx, engine, r["question"], json.dumps(r), params, 4096) for r in rows[:4])
        )
        await ctx.aclose()
        return ctx, results

    ctx, results = run(main())
    correct, wrong, no_answer, format_error = results
    assert [r.outcome for r in results] == ["correct", "wrong", "no_answer", "format_error"]
    assert len(correct.action_ranges) == 3 and len(no_answer.action_ranges) == 5
    for result in results:
        assert len(result.step_rewards) == len(result.action_ranges)
        tokens = result.observation_tokens
        for (_start, end), (next_start, _) in zip(result.action_ranges, result.action_ranges[1:], strict=False):
            feedback = tokenizer.decode(tokens[end:next_start])
            assert "Retrieved documents for step" in feedback  # environment tokens lie between actions
        for start, end in result.action_ranges:
            action = tokenizer.decode(tokens[start:end])
            assert "Retrieved documents" not in action and action.endswith("<|im_end|>")
    # the r3 constants, with relevance from the reward server's own /relevance
    question = rows[0]["question"]
    steps = correct.record["steps"]
    for step, reward_value in zip(steps[:2], correct.step_rewards[:2], strict=True):
        assert len(step["doc_ids"]) == 5
        assert reward_value == pytest.approx(step["relevance"] * 1.6)
    hits = httpx.post(
        retriever.url + "/retrieve", json={"queries": [hops(rows[0])[0]], "topk": 5, "return_scores": True}
    ).json()
    texts = [hit["document"]["contents"] for hit in hits["result"][0]]
    expected = run(relevance_of(reward, question, "first hop", hops(rows[0])[0], texts))
    assert steps[0]["relevance"] == pytest.approx(expected)
    assert correct.step_rewards[2] == 2.0 and correct.score == 1.0
    assert wrong.step_rewards[0] == pytest.approx(wrong.record["steps"][0]["relevance"] * 0.8)
    assert wrong.step_rewards[1] == 0.0 and wrong.score == 0.0
    assert no_answer.step_rewards == pytest.approx([s["relevance"] * 0.9 for s in no_answer.record["steps"]])
    assert format_error.step_rewards[0] == pytest.approx(format_error.record["steps"][0]["relevance"])
    assert format_error.step_rewards[1] == pytest.approx(-0.9)
    assert format_error.record["steps"][1]["format_error"] == "missing_analysis"
    # episodes in flight shared batched retrieval calls
    assert ctx.search_batcher.mean_batch > 1.0
    assert ctx.stats.episodes == 4 and 0.0 < ctx.stats.environment_share < 1.0


def test_outcome_gold_hit_and_r3_gold_schemes_and_format_regeneration(world, retriever, reward, tokenizer, model):
    row = world["rows"][4]
    first, second = hops(row)

    async def main(scheme: str, plan: list):
        ctx = RolloutContext(config(retriever, reward, reward={"scheme": scheme}, env={"format_retries": 3}), tokenizer)
        engine, script = scripted_engine(model, tokenizer, ctx)
        script.plans = {row["question"]: plan}
        result = await run_episode(ctx, engine, row["question"], json.dumps(row), SamplingParams(), 4096)
        await ctx.aclose()
        return result

    plan = [query_step("a", first), ["no format", query_step("b", second)], answer_step("c", row["golden_answers"][0])]
    outcome = run(main("outcome", plan))
    assert outcome.step_rewards == [0.0, 0.0, 2.0]
    assert outcome.record["steps"][1]["format_retries"] == 1 and outcome.extra_logs["format_retries"] == 1.0
    gold = run(main("gold_hit", plan))
    found = [s["new_gold"] for s in gold.record["steps"][:2]]
    assert gold.step_rewards[:2] == pytest.approx([0.2 * n for n in found])
    complete = sum(found) == len(row["metadata"]["supporting_passage_ids"])
    assert gold.step_rewards[2] == (0.3 if complete else 0.0)
    # r3_gold: R3's outcome scaling (1.6 for a right answer) of the share of the gold passages each step found first
    labelled = run(main("r3_gold", plan))
    total = len(row["metadata"]["supporting_passage_ids"])
    assert labelled.step_rewards == pytest.approx([1.6 * n / total for n in found] + [2.0]) and sum(found) > 0
    early = run(main("gold_hit", [answer_step("no need", "yes")]))
    assert early.step_rewards == [0.0] and early.score == 0.0


def test_stop_after_action_cuts_the_steps_tokens_where_its_query_ends(world, retriever, reward, tokenizer, model):
    """env.stop_after_action in token space: what the policy wrote after its query is neither shown nor trained on."""
    row = world["rows"][5]
    first, _ = hops(row)

    async def main(stop_after_action: bool):
        env = {"stop_after_action": stop_after_action}
        ctx = RolloutContext(config(retriever, reward, reward={"scheme": "outcome"}, env=env), tokenizer)
        engine, script = scripted_engine(model, tokenizer, ctx)
        both = query_step("a", first) + "\nThe final answer: a guess made too early"
        script.plans = {row["question"]: [both, answer_step("b", row["golden_answers"][0])]}
        result = await run_episode(ctx, engine, row["question"], json.dumps(row), SamplingParams(), 4096)
        await ctx.aclose()
        return result

    assert run(main(False)).outcome == "format_error"
    result = run(main(True))
    assert result.outcome == "correct" and result.record["steps"][0]["query"] == first
    (start, end), (next_start, _) = result.action_ranges
    tokens = result.observation_tokens
    assert tokenizer.decode(tokens[start:end]) == query_step("a", first)  # cut at the query's end
    assert tokenizer.decode(tokens[end:next_start]).startswith("<|im_end|>")  # the environment's turn closes it
    assert "too early" not in tokenizer.decode(tokens)


def test_the_question_first_retrieval_reaches_the_prompt_and_r3_gold_pays_only_for_new_gold(
    world, retriever, reward, tokenizer, model
):
    """env.question_docs (3, the policy's queries 5): the service's top 3 for the question open the episode."""
    questions = [row["question"] for row in world["rows"]]
    body = {"queries": questions, "topk": 3, "return_scores": True}
    found = httpx.post(retriever.url + "/retrieve", json=body).json()["result"]
    tops = [[hit["document"] for hit in hits] for hits in found]
    # a question whose own retrieval finds one of its two gold passages
    row, top = next(
        (row, top)
        for row, top in zip(world["rows"], tops, strict=True)
        if len({d["id"] for d in top} & set(row["metadata"]["supporting_passage_ids"])) == 1
    )
    first, second = hops(row)
    gold_ids = row["metadata"]["supporting_passage_ids"]

    async def main():
        settings = config(retriever, reward, reward={"scheme": "r3_gold"}, env={"question_docs": 3})
        ctx = RolloutContext(settings, tokenizer)
        engine, script = scripted_engine(model, tokenizer, ctx)
        script.plans = {row["question"]: [query_step("a", first), query_step("b", second), answer_step("c", "x")]}
        result = await run_episode(ctx, engine, row["question"], json.dumps(row), SamplingParams(), 4096)
        await ctx.aclose()
        return ctx, result

    ctx, result = run(main())
    assert result.record["question_doc_ids"] == [d["id"] for d in top]
    prompt = tokenizer.decode(result.observation_tokens[: result.action_ranges[0][0]])
    assert all(d["contents"].split("\n")[0] in prompt for d in top)
    assert [len(step["doc_ids"]) for step in result.record["steps"][:2]] == [5, 5]  # the policy's own depth
    found = [step["new_gold"] for step in result.record["steps"][:2]]
    shown = {i for step in result.record["steps"][:2] for i in step["doc_ids"]}
    assert sum(found) == len(set(gold_ids) & shown - {d["id"] for d in top})  # the question's gold is no step's
    assert result.step_rewards[:2] == pytest.approx([0.8 * n / len(gold_ids) for n in found])  # a wrong answer: 0.8
    assert ctx.retrieval_busy_s > ctx.search_batcher.busy_s > 0  # two depths, two batched calls


def test_lws_on_the_tags_format_follows_the_trainers_step_and_the_shapes(world, retriever, reward, tokenizer, model):
    """The stage clock reaches the reward as on a cluster: episodes this engine ran // episodes_per_step."""
    tags = get_format("tags")
    row = world["rows"][6]
    first, second = hops(row)
    gold = row["golden_answers"][0]
    plan = [
        tags.render_step(Step("I need the first fact.", query=first)),
        tags.render_step(Step("Next the second.", query=second, reflection="The documents name it.")),
        tags.render_step(Step("", answer=gold, reflection="Both facts are in.")),
    ]
    no_reflection = plan[:1] + [tags.render_step(Step("Next the second.", query=second))]
    sections = {
        "policy": {"step_format": "tags"},
        "reward": {
            "scheme": "lws",
            "options": {"switch_step": 2},
            "query_encoder": minilm_path(),
            "episodes_per_step": 2,
            "start_step": 1,
        },
    }

    async def main():
        ctx = RolloutContext(config(retriever, reward, **sections), tokenizer)
        script = Script(tokenizer, {row["question"]: plan}, step_format="tags")
        engine = HFEngine(model, tokenizer, max_batch=4, script=script)
        results = []
        for episode in range(3):  # steps 1, 1, 2: the last one is in stage 2
            script.plans = {row["question"]: no_reflection if episode == 1 else plan}
            results.append(await run_episode(ctx, engine, row["question"], json.dumps(row), SamplingParams(), 4096))
        await ctx.aclose()
        return ctx, results

    ctx, (stage1, broken, stage2) = run(main())
    assert [r.extra_logs["reward_step"] for r in (stage1, broken, stage2)] == [1.0, 1.0, 2.0]
    assert ctx.training_step == 2 and [r.outcome for r in (stage1, broken, stage2)] == [
        "correct",
        "format_error",
        "correct",
    ]
    vectors = Encoder(minilm_path()).encode([first, second])
    similarity = float(vectors[0] @ vectors[1] / (np.linalg.norm(vectors[0]) * np.linalg.norm(vectors[1])))
    assert stage1.step_rewards == pytest.approx([0.0, 0.0, 1.0 - similarity + 1.0], abs=1e-5)
    assert stage2.step_rewards == pytest.approx([0.0, 0.0, 1.0 - 0.3 * 2 - similarity + 1.0], abs=1e-5)
    # after <information> a tags turn opens with <reflect>: the second step broke the shape
    assert broken.record["steps"][1]["format_error"] == "missing_reflection"
    assert not is_concise(first)  # the world's sub-questions are questions: -1 for a single verbose query
    assert broken.step_rewards[-1] == pytest.approx(-1.0 + 0.3 * 1 - 1.0 - 1.0)  # stage 1, wrong, RC 1, bad format
    assert stage1.record["steps"][1]["reflection"] == "The documents name it."


def test_a_dead_service_gives_a_flagged_neutral_episode_not_an_exception(world, reward, tokenizer, model):
    from conftest import free_port

    row = world["rows"][5]

    async def main(env=None):
        dead = f"http://127.0.0.1:{free_port()}"
        values = {"services": {"retriever_url": dead, "reward_url": reward.url, "retries": 1, "backoff_s": 0.01}}
        values["env"] = env or {}
        ctx = RolloutContext(RolloutConfig.from_dict(values), tokenizer)
        engine, script = scripted_engine(model, tokenizer, ctx)
        script.plans = {row["question"]: [query_step("a", hops(row)[0])]}
        result = await run_episode(ctx, engine, row["question"], json.dumps(row), SamplingParams(), 4096)
        await ctx.aclose()
        return ctx, result

    ctx, result = run(main())
    assert result.outcome == "service_failure" and result.extra_logs["service_failure"] == 1.0
    assert result.step_rewards == [0.0] and len(result.action_ranges) == 1
    assert ctx.stats.service_failures == 1
    # the question's own retrieval (env.question_docs) failed before any step: the episode is its prompt
    ctx, result = run(main({"question_docs": 3}))
    assert result.outcome == "service_failure" and result.action_ranges == [] and result.step_rewards == []
    assert tokenizer.decode(result.observation_tokens).endswith(ChatRenderer(tokenizer).prompt(row["question"]))


def test_a_label_without_answers_is_flagged_neutral(world, retriever, reward, tokenizer, model):
    async def main():
        ctx = RolloutContext(config(retriever, reward), tokenizer)
        engine, script = scripted_engine(model, tokenizer, ctx)
        script.plans = {"Who?": [answer_step("a", "Ann")]}
        result = await run_episode(ctx, engine, "Who?", "[]", SamplingParams(), 4096)
        await ctx.aclose()
        return result

    result = run(main())
    assert result.outcome == "label_problem" and result.step_rewards == [0.0]


def test_out_of_context_ends_the_episode_without_answer(world, retriever, reward, tokenizer, model):
    row = world["rows"][6]

    async def main():
        ctx = RolloutContext(config(retriever, reward, env={"max_step_tokens": 64}), tokenizer)
        engine, script = scripted_engine(model, tokenizer, ctx)
        script.plans = {row["question"]: [query_step("a", hops(row)[0])]}
        prompt_length = len(tokenizer(ctx.renderer.prompt(row["question"]))["input_ids"])
        result = await run_episode(ctx, engine, row["question"], json.dumps(row), SamplingParams(), prompt_length + 200)
        await ctx.aclose()
        return result

    result = run(main())
    assert result.outcome == "no_answer" and result.extra_logs["out_of_context"] == 1.0
    assert len(result.step_rewards) == len(result.action_ranges) >= 1


def test_rollout_config_reads_the_agent_environment_variables(tmp_path, monkeypatch):
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump({"env": {"max_steps": 3}, "reward": {"scheme": "outcome"}}))
    monkeypatch.setenv("R3RAG_AGENT_CONFIG", str(path))
    monkeypatch.setenv("R3RAG_AGENT_OVERRIDES", json.dumps({"services.reward_url": "http://judge:9", "env.topk": 3}))
    loaded = agent_config_from_environment()
    assert (loaded.env.max_steps, loaded.env.topk, loaded.reward.scheme) == (3, 3, "outcome")
    assert loaded.services.reward_url == "http://judge:9"
    monkeypatch.setenv("R3RAG_AGENT_OVERRIDES", json.dumps({"env.max_stepz": 3}))
    with pytest.raises(ValueError, match="unknown key 'max_stepz'"):
        agent_config_from_environment()
    monkeypatch.setenv("R3RAG_AGENT_OVERRIDES", "max_steps=3")
    with pytest.raises(ValueError, match="R3RAG_AGENT_OVERRIDES .dotted keys. must be a JSON object"):
        agent_config_from_environment()


def test_lws_needs_its_clock_and_encoder_configured(tokenizer):
    with pytest.raises(ValueError, match="query_encoder"):
        RolloutContext(RolloutConfig(reward=EpisodeRewardConfig(scheme="lws")), tokenizer, search=FixedSearch())
    with pytest.raises(ValueError, match="episodes_per_step"):
        RolloutContext(
            RolloutConfig(reward=EpisodeRewardConfig(scheme="lws", options={"diversity": False})),
            tokenizer,
            search=FixedSearch(),
        )
    assert ServicesConfig().episode_retries == 1


# -- R2AG: multi_query expansion steps scored by top_survivor --------------------------------------------

MQ = get_format("multi_query")
R2AG = load_recipe("r2ag")
GOLD_CONTEXT = Passage.from_title_text(
    "g1", "Hestolvale Tower", "Hestolvale Tower is a 1962 film directed by Marta Kell."
)
GOLD_BIRTH = Passage.from_title_text("g2", "Marta Kell", "Marta Kell (born 1921 in Oslo) is a film director.")
GOLD_RIVER = Passage.from_title_text("g3", "Oslo", "The Akerselva river flows through Oslo.")
NOT_GOLD = Passage.from_title_text("n1", "Tower Records", "Tower Records is a music retailer.")


class MappedSearch:
    """An in-process retriever (RolloutContext's ``search``): each query's ranking is the passages listed for it."""

    def __init__(self, table: dict[str, list[Passage]]) -> None:
        self.table = table
        self.calls: list[list[str]] = []

    async def search(self, queries, k: int) -> list[list[Hit]]:
        self.calls.append(list(queries))
        return [[Hit(p, 1.0 - rank / 10) for rank, p in enumerate(self.table.get(q, [])[:k])] for q in queries]


R2AG_SEARCH = {
    "Marta Kell birthplace": [GOLD_BIRTH, NOT_GOLD],  # top-1 only: n1 is never retrieved for it
    "Tower Records": [NOT_GOLD, GOLD_RIVER],
    "Hestolvale Tower director": [GOLD_CONTEXT],
    "Marta Kell": [GOLD_BIRTH],
    "Oslo river": [GOLD_RIVER],
}


def r2ag_label(question: str) -> str:
    return json.dumps(
        {
            "question": question,
            "golden_answers": ["Akerselva"],
            "gold_ids": ["g1", "g2", "g3"],
            "start_documents": [GOLD_CONTEXT.to_json()],  # the round starts from the gold document found before
        }
    )


def r2ag_config(**env) -> RolloutConfig:
    """recipes/r2ag.yaml (format, limits, scheme and constants), with ``env`` overrides."""
    return R2AG.rollout_config({f"env.{name}": value for name, value in env.items()})


async def run_r2ag(tokenizer, model, config: RolloutConfig, plans: dict) -> tuple[RolloutContext, MappedSearch, list]:
    search = MappedSearch(R2AG_SEARCH)
    ctx = RolloutContext(config, tokenizer, search=search)
    engine = HFEngine(model, tokenizer, max_batch=4, script=Script(tokenizer, plans, step_format="multi_query"))
    results = []
    for question in plans:  # one after another: each step's queries make one batched retrieval call
        results.append(await run_episode(ctx, engine, question, r2ag_label(question), SamplingParams(), 4096))
    await ctx.aclose()
    return ctx, search, results


def test_an_r2ag_training_sample_is_one_expansion_step_from_its_context(tokenizer, model):
    """r2ag.yaml: one step (max_steps 1) from the label's context, each query's top-1, the Top-Survivor reward."""
    expand = Step(
        "Kell directed it; I need her birthplace and the river there.",
        queries=("Marta Kell birthplace", "Tower Records", "Hestolvale Tower director"),
        predicted=("Oslo river",),
    )
    with_stop = Step(expand.analysis, queries=expand.queries, predicted=expand.predicted, stop=True)
    early = Step(expand.analysis, queries=expand.queries[:2], stop=True)  # g3 is still missing
    plans = {
        "Which river flows through the birthplace of the director of Hestolvale Tower?": [MQ.render_step(with_stop)],
        "Name the river of the city where the director of Hestolvale Tower was born.": [MQ.render_step(expand)],
        "Through which city's river ... (the director of Hestolvale Tower)?": [MQ.render_step(early)],
        "Which film did Marta Kell direct?": ["<base-query>Marta Kell</base-query>"],  # no think block
    }
    config = r2ag_config()
    assert (config.policy.step_format, config.reward.scheme, config.env.topk, config.env.max_steps) == (
        "multi_query",
        "top_survivor",
        1,
        1,
    )
    ctx, search, (stopped, open_ended, early_stop, broken) = run(run_r2ag(tokenizer, model, config, plans))
    step = stopped.record["steps"][0]
    assert step["kind"] == "query" and step["query"] is None and step["stop"] is True
    assert step["queries"] == list(expand.queries) and step["predicted"] == ["Oslo river"]
    assert step["hits"] == [["g2"], ["n1"], ["g1"], ["g3"]]  # per query, base first, top-1 each
    assert search.calls[0] == [*expand.queries, "Oslo river"]  # the step's four queries in one batched call
    # R_MH: g2 (base, new) + 1.25 x g3 (predicted, new); g1 is gold but was in the context
    # R_AP counts new gold only: base [gold, miss, held] -> (1/3)(1/1); predicted [gold] -> (1/3)(1/1)
    # R_f: four blocks, capped at 0.02; R_JH: g1 (context) + g2 + g3 is every gold document, and it stopped
    mh, ap = 1 + 1.25, 1 / 3 + 1 / 3
    assert stopped.step_rewards == pytest.approx([0.2 * mh + 0.2 * ap + 0.02 + 0.3])
    # OpenRLHF's dynamic filtering reads the episode's reward as its score (all-zero groups are dropped)
    assert stopped.outcome == "no_answer" and stopped.score == pytest.approx(sum(stopped.step_rewards))
    assert open_ended.step_rewards == pytest.approx([0.2 * mh + 0.2 * ap + 0.02])  # no stop: no Joint-Hit
    assert open_ended.record["steps"][0]["stop"] is False and open_ended.outcome == "no_answer"
    assert early_stop.record["steps"][0]["hits"] == [["g2"], ["n1"]]
    assert early_stop.step_rewards == [0.0] and early_stop.score == 0.0  # stopped with g3 missing
    assert broken.outcome == "format_error" and broken.step_rewards == [0.0]
    assert broken.record["steps"][0]["format_error"] == "missing_analysis"
    # the prompt shows the context document under the question, exactly as the renderer writes it
    for result, question in zip((stopped, open_ended, early_stop, broken), plans, strict=True):
        start = result.action_ranges[0][0]
        assert (
            result.observation_tokens[:start]
            == tokenizer(ctx.renderer.prompt(question, [GOLD_CONTEXT]), add_special_tokens=False)["input_ids"]
        )
        prompt = tokenizer.decode(result.observation_tokens[:start])
        assert "Documents found so far:" in prompt and GOLD_CONTEXT.text in prompt
        assert ctx.renderer.question_of(prompt) == question


def test_a_multi_step_r2ag_episode_ends_on_a_stop_only_step(tokenizer, model):
    """Three steps: new gold per query across steps, then the stop signal alone (STOPPED) earns the Joint-Hit."""
    first = Step(
        "Kell directed it; find where she was born.",
        queries=("Marta Kell birthplace", "Tower Records"),
        predicted=("Hestolvale Tower director",),
    )
    second = Step("Born in Oslo; now the river.", queries=("Marta Kell",), predicted=("Oslo river",))
    done = Step("All three documents are in.", stop=True)
    complete = "Which river flows through the birthplace of the director of Hestolvale Tower?"
    premature = "Name the river of the city where the director of Hestolvale Tower was born."
    plans = {
        complete: [MQ.render_step(first), MQ.render_step(second), MQ.render_step(done)],
        premature: [MQ.render_step(first), MQ.render_step(done)],
    }
    ctx, search, (result, early) = run(run_r2ag(tokenizer, model, r2ag_config(max_steps=5), plans))
    steps = result.record["steps"]
    assert [s["kind"] for s in steps] == ["query", "query", "stop"] and result.outcome == "stopped"
    assert [s["hits"] for s in steps] == [[["g2"], ["n1"], ["g1"]], [["g2"], ["g3"]], []]
    assert steps[2]["stop"] is True and steps[2]["analysis"] == "All three documents are in."
    assert search.calls[:2] == [[*first.queries, *first.predicted], [*second.queries, *second.predicted]]
    # step 1: g2 new (base); g1 gold but from the context. AP (new gold only) base [gold, miss] (1/3);
    # predicted [held] 0. Step 2: g2 again (held); g3 new (predicted, 1.25). AP base 0; predicted (1/3)
    # step 3: the stop signal alone, with g1 + g2 + g3 found: R_JH
    expected = [0.2 * 1 + 0.2 * (1 / 3) + 0.02, 0.2 * 1.25 + 0.2 * (1 / 3) + 0.02, 0.3]
    assert result.step_rewards == pytest.approx(expected)
    assert len(result.action_ranges) == 3 and result.score == pytest.approx(sum(expected))
    # the documents of step 1 were shown under the multi_query header (the union of the queries' top-1)
    tokens = result.observation_tokens
    feedback = tokenizer.decode(tokens[result.action_ranges[0][1] : result.action_ranges[1][0]])
    assert "Documents retrieved at step 1:" in feedback
    shown = feedback[feedback.index("Documents retrieved at step 1:") :].split("<|im_end|>")[0]
    assert [p.title for p in MQ.parse_documents(shown)] == ["Marta Kell", "Tower Records", "Hestolvale Tower"]
    assert steps[0]["doc_ids"] == ["g2", "n1", "g1"]
    # stopping after the first step leaves g3 unfound: every step gets 0
    assert early.outcome == "stopped" and early.step_rewards == [0.0, 0.0] and early.score == 0.0


def test_multi_query_steps_through_the_retrieval_service(world, retriever, tokenizer, model):
    """Several queries of one step go to the real BM25 service in one request; hits are its top-1 per query."""
    row = world["rows"][7]
    first, second = hops(row)
    gold = set(row["metadata"]["supporting_passage_ids"])
    step = Step("Both hops at once.", queries=(first, second), predicted=(row["question"],))

    async def main():
        values = {
            "services": {"retriever_url": retriever.url, "backoff_s": 0.05},
            "policy": {"step_format": "multi_query"},
            "reward": {"scheme": "top_survivor"},
            "env": {"topk": 1, "max_steps": 1},
        }
        ctx = RolloutContext(RolloutConfig.from_dict(values), tokenizer)
        script = Script(tokenizer, {row["question"]: [MQ.render_step(step)]}, step_format="multi_query")
        engine = HFEngine(model, tokenizer, max_batch=4, script=script)
        result = await run_episode(ctx, engine, row["question"], json.dumps(row), SamplingParams(), 4096)
        await ctx.aclose()
        return ctx, result

    ctx, result = run(main())
    answer = httpx.post(
        retriever.url + "/retrieve",
        json={"queries": [first, second, row["question"]], "topk": 1, "return_scores": True},
    ).json()
    top = [hits[0]["document"]["id"] for hits in answer["result"]]
    assert set(top) & gold  # BM25 finds gold for this world's hops, so the hit terms are exercised
    assert result.record["steps"][0]["hits"] == [[i] for i in top]
    assert ctx.search_batcher.calls == 1 and ctx.search_batcher.items == 3
    # the Top-Survivor terms from the service's own top-1 results (no context, nothing stopped)
    base_new = [top[0] in gold, top[1] in gold and top[1] != top[0]]  # AP counts each gold document once
    new_base = sum(base_new)
    new_predicted = top[2] in gold and top[2] not in top[:2]
    ap = sum(base_new[u] * sum(base_new[: u + 1]) / (u + 1) for u in range(2)) / len(gold)
    ap += new_predicted / len(gold)
    assert result.step_rewards == pytest.approx([0.2 * (new_base + 1.25 * new_predicted) + 0.2 * ap + 0.02])
    assert result.outcome == "no_answer"


def test_a_gold_passage_the_document_cap_held_back_is_not_found_in_single_query_formats(tokenizer, model):
    """gold_hit on r3 with env.max_total_docs 1: step 2's gold top-1 is never shown, so it is not found (and no
    completion bonus); only multi_query steps count each query's top-1 as found (R2AG's vertices)."""
    r3 = get_format("r3")
    plans = {
        "Which river flows through the birthplace of Marta Kell?": [
            r3.render_step(Step("I need her birthplace.", query="Marta Kell")),
            r3.render_step(Step("Now the river.", query="Oslo river")),
            r3.render_step(Step("Found it.", answer="Akerselva")),
        ]
    }
    values = {
        "env": {"max_total_docs": 1, "topk": 1},
        "reward": {"scheme": "gold_hit", "placement": "scalar"},
        "policy": {"step_format": "r3"},
    }
    config = RolloutConfig.from_dict(values)

    async def main():
        search = MappedSearch(R2AG_SEARCH)
        ctx = RolloutContext(config, tokenizer, search=search)
        engine = HFEngine(model, tokenizer, max_batch=4, script=Script(tokenizer, plans, step_format="r3"))
        question = next(iter(plans))
        label = json.dumps({"question": question, "golden_answers": ["Akerselva"], "gold_ids": ["g2", "g3"]})
        result = await run_episode(ctx, engine, question, label, SamplingParams(), 4096)
        await ctx.aclose()
        return result

    result = run(main())
    steps = result.record["steps"]
    assert [s["hits"] for s in steps[:2]] == [[["g2"]], [["g3"]]] and steps[1]["doc_ids"] == []  # capped: not shown
    assert [s["new_gold"] for s in steps[:2]] == [1, 0]
    assert result.step_rewards == [0.0, 0.0, 0.0] and result.score == 0.0  # answered before g3 was found
