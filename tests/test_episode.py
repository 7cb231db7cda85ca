"""The finished episode: one outcome classification, records that read back in every step format, and a
reward scheme with a signal of its own that needs nothing but its file and a registry line."""

from __future__ import annotations

import asyncio
import json

import pytest
from conftest import CHATML_TEMPLATE, Script, make_tokenizer, save_tiny_causal_lm

from r3_env.chat_client import ChatReply
from r3_env.data import Passage
from r3_env.engines import HFEngine, SamplingParams
from r3_env.env import EnvConfig, RetrievalEnv
from r3_env.episode import Outcome, Trace, classify
from r3_env.protocol import ChatRenderer, MessageRenderer, Step, Turn, available_formats, get_format
from r3_env.records import episode_fields, play, question_documents_of, turns_of
from r3_env.retrieval.base import Hit
from r3_env.rewards import Episode, RewardScheme, at_last_step, get_scheme, register_scheme
from r3_env.rollout import run_episode
from r3_env.rollout_config import RolloutConfig
from r3_env.rollout_context import RolloutContext
from reward_server.config import RewardConfig as ServerRewardConfig
from reward_server.metrics import RewardMetrics
from reward_server.scoring import score_transcripts

# -- the outcome, decided in one place --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("format_error", "last", "correct", "expected"),
    [
        ("empty", Step("a", answer="x"), True, Outcome.FORMAT_ERROR),
        (None, None, False, Outcome.NO_ANSWER),
        (None, Step("a", query="q"), False, Outcome.NO_ANSWER),
        (None, Step("a", queries=["q"], stop=True), False, Outcome.NO_ANSWER),  # stop after its queries
        (None, Step("a", stop=True), False, Outcome.STOPPED),
        (None, Step("a", answer="x"), False, Outcome.WRONG),
        (None, Step("a", answer="x"), True, Outcome.CORRECT),
    ],
)
def test_classify_decides_every_scored_outcome(format_error, last, correct, expected):
    assert classify(format_error, last, correct) is expected


def test_outcomes_are_strings_and_the_neutral_ones_are_never_scored():
    assert json.dumps([Outcome.SERVICE_FAILURE, Outcome.CORRECT]) == '["service_failure", "correct"]'
    assert Outcome.CORRECT.log_key == "outcome_correct" and Outcome.LABEL_PROBLEM.log_key == "label_problem"
    for neutral in (Outcome.SERVICE_FAILURE, Outcome.LABEL_PROBLEM, Outcome.UNREADABLE):
        with pytest.raises(ValueError, match="not scored"):
            Episode(neutral)


# -- records: every format's steps read back --------------------------------------------------------------

STEPS = {
    "r3": [Step("Need the director.", query="Hestolvale Tower director"), Step("It is Kell.", answer="Marta Kell")],
    "tags": [Step("Need it.", query="Hestolvale Tower director"), Step("", answer="Kell", reflection="Found.")],
    "react": [Step("Need the director.", query="Hestolvale Tower director"), Step("Found.", answer="Marta Kell")],
    "multi_query": [
        Step("Two facts are missing.", queries=["Hestolvale Tower director", "Marta Kell"], predicted=["Oslo"]),
        Step("Every fact is found.", stop=True),
    ],
}


def test_every_registered_format_has_steps_under_test():
    assert sorted(STEPS) == available_formats()


@pytest.mark.parametrize("name", sorted(STEPS))
def test_a_step_serialises_itself_in_every_format(name):
    for step in STEPS[name]:
        step = get_format(name).express(step)
        assert Step.from_json(json.loads(json.dumps(step.to_json()))) == step


class ListedSearch:
    """Each query's own two passages, so the record's documents are known (a RetrievalEnv's or a context's search)."""

    async def __call__(self, query: str, k: int) -> list[Hit]:
        return [Hit(Passage(f"{query}#{i}", f"{query} {i}\nAbout {query}."), 1.0) for i in range(2)][:k]

    async def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        return [await self(query, k) for query in queries]


@pytest.mark.parametrize("name", sorted(STEPS))
def test_a_record_round_trips_in_every_format(name):
    """play() writes the steps, episode_fields() makes the record, turns_of() reads the same steps back."""
    renderer = MessageRenderer(name)
    steps = [renderer.format.express(step) for step in STEPS[name]]
    env = RetrievalEnv(EnvConfig(max_steps=3), renderer, ListedSearch(), "Which river flows through Oslo?")
    replies = iter(renderer.format.render_step(step) for step in steps)

    async def write(messages, turns) -> ChatReply:
        return ChatReply(next(replies))

    asyncio.run(play(env, renderer, write))
    row = json.loads(json.dumps(episode_fields(env)))
    turns = turns_of(row)
    assert [turn.step for turn in turns] == steps
    first = turns[0]
    assert [p.id for p in first.documents] == [p.id for p in env.documents[0]]
    assert row["num_steps"] == len(steps) and "invalid" not in row


def test_the_questions_own_documents_are_shown_recorded_read_back_and_counted_as_read():
    """env.question_docs in play(): the writer sees them with the question, the record keeps them, and
    evaluation counts them among the documents read (Full-Recall, docs)."""
    from eval.metrics import question_metrics

    renderer = MessageRenderer("r3")
    question = "Which river flows through Oslo?"
    env = RetrievalEnv(EnvConfig(max_steps=3, question_docs=2), renderer, ListedSearch(), question)
    replies = iter([renderer.format.render_step(step) for step in STEPS["r3"]])
    seen: list[list[dict[str, str]]] = []

    async def write(messages, turns) -> ChatReply:
        seen.append(messages)
        return ChatReply(next(replies))

    asyncio.run(play(env, renderer, write))
    assert f"{question} 1\nAbout {question}." in seen[0][-1]["content"]  # the first user turn holds them
    row = json.loads(json.dumps(episode_fields(env)))
    assert [d["id"] for d in row["question_documents"]] == [f"{question}#0", f"{question}#1"]
    assert question_documents_of(row) == tuple(env.question_documents)
    gold = [f"{question}#1", "Hestolvale Tower director#0"]
    row.update(prediction="Marta Kell", golden_answers=["Marta Kell"], gold_ids=gold)
    metrics = question_metrics(row, cutoff=4, verdict=None)
    assert metrics["docs"] == 4 and metrics["retrieval"]["full_recall"] == 1.0  # 2 with the question, 2 by the query
    assert question_metrics({**row, "question_documents": []}, 4, None)["retrieval"]["full_recall"] == 0.0
    with pytest.raises(ValueError, match="question_documents"):
        question_documents_of({"question_documents": [{"id": "1"}]})


def test_query_with_question_searches_the_query_followed_by_the_question_and_records_the_query():
    """env.query_with_question over a real BM25 index: the bare entity query finds the wrong "Mercury", the
    query with the question's words the planet; the step's record keeps what the policy wrote."""
    from r3_env.retrieval.bm25 import BM25Retriever

    retriever = BM25Retriever.from_passages(
        [
            Passage.from_title_text("element", "Mercury (element)", "Mercury is an element. Mercury is a metal."),
            Passage.from_title_text("planet", "Mercury (planet)", "The planet nearest the sun; a year lasts 88 days."),
        ]
    )
    sent: list[str] = []

    async def search(query: str, k: int) -> list[Hit]:
        sent.append(query)
        return (await asyncio.to_thread(retriever.search, [query], k))[0]

    question = "How many days does a year last on the planet closest to the sun?"
    renderer = MessageRenderer("r3")
    step = renderer.format.render_step(Step(analysis="I look up the planet.", query="Mercury"))
    found = {}
    for expand in (False, True):
        env = RetrievalEnv(EnvConfig(max_steps=2, topk=1, query_with_question=expand), renderer, search, question)
        env.reset()
        asyncio.run(env.step(step))
        found[expand] = env.steps[0].doc_ids
        assert env.steps[0].step.query == "Mercury"
    assert sent == ["Mercury", f"Mercury {question}"]
    assert found == {False: ["element"], True: ["planet"]}


# -- a scheme with a signal of its own: this file and one registry line ---------------------------------------


def answer_words(trace: Trace) -> int:
    """The new signal: how many words the final answer has (0 without one)."""
    return len(trace.answer.split()) if trace.answer else 0


def brevity_rewards(episode: Episode) -> list[float]:
    """1 / (number of words of the answer), at the last step; nothing for an episode without one."""
    words = episode.signals["answer_words"]
    return at_last_step(episode, 1.0 / words if words else 0.0)


def _brevity() -> RewardScheme:
    signals = {"answer_words": answer_words}  # declared with the function that computes it
    return RewardScheme("brevity", brevity_rewards, needs_relevance=False, needs_correctness=False, signals=signals)


register_scheme("brevity", _brevity)


def test_a_new_scheme_reads_its_own_signal_through_the_real_rollout(bpe_backend, tmp_path):
    from transformers import AutoModelForCausalLM

    tokenizer = make_tokenizer(bpe_backend, CHATML_TEMPLATE)
    model = AutoModelForCausalLM.from_pretrained(save_tiny_causal_lm(tmp_path, tokenizer))
    fmt = get_format("r3")
    question = "Who directed Hestolvale Tower?"
    plan = [
        fmt.render_step(Step("Need it.", query="Hestolvale Tower")),
        fmt.render_step(Step("Got it.", answer="Kell")),
    ]
    plans = {question: plan, "Where was Marta Kell born?": [fmt.render_step(Step("Easy.", answer="in Oslo town"))]}

    async def main():
        config = RolloutConfig.from_dict({"reward": {"scheme": "brevity", "placement": "scalar"}})
        ctx = RolloutContext(config, tokenizer, search=ListedSearch())
        engine = HFEngine(model, tokenizer, max_batch=4, script=Script(tokenizer, plans))
        label = json.dumps({"golden_answers": ["Marta Kell"]})
        results = [await run_episode(ctx, engine, q, label, SamplingParams(), 4096) for q in plans]
        await ctx.aclose()
        return results

    one_word, three_words = asyncio.run(main())
    assert one_word.outcome == "wrong" and one_word.step_rewards == [0.0, 1.0]  # an unchecked answer counts as wrong
    assert three_words.step_rewards == [pytest.approx(1 / 3)]

    # the reward server's /get_reward takes it as it is, and scores the same transcript alike
    ServerRewardConfig(scheme="brevity")
    renderer = ChatRenderer(tokenizer)
    turns = [Turn(Step("Need it.", query="Hestolvale Tower"), [Passage("d1", "Hestolvale Tower\nBy Kell.")])]
    turns.append(Turn(Step("Got it.", answer="Marta Kell")))
    query, prompt = renderer.transcript(question, turns), renderer.prompt(question)
    scheme, label = get_scheme("brevity"), {"golden_answers": ["Marta Kell"]}
    scored = asyncio.run(score_transcripts(renderer, None, scheme, RewardMetrics(), [query], [prompt], [label], 5))
    assert scored["outcomes"] == ["correct"] and scored["step_rewards"] == [[0.0, 0.5]]
