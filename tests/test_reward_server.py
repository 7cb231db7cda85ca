"""The reward server on a real port, in front of a real OpenAI-compatible stand-in judge server."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml
from conftest import CHATML_TEMPLATE, ROOT, ServiceProcess, free_port, make_tokenizer, run_r3rag, save_tiny_causal_lm

from r3_env.data import Passage
from r3_env.protocol import ChatRenderer, Step, Turn
from r3_env.rewards import Episode, Outcome, get_scheme
from reward_server.config import JudgeConfig
from reward_server.judges.backends import LocalHFBackend, OpenAIChatBackend
from reward_server.judges.base import CorrectnessItem, RelevanceItem
from reward_server.judges.lexical import LexicalJudge
from reward_server.judges.llm import LLMJudge
from reward_server.judges.parsing import analysis_of, parse_correctness, parse_relevance
from reward_server.metrics import RewardMetrics
from reward_server.scoring import parse_transcript

STANDIN = str(ROOT / "tests" / "standin_judge.py")

# -- parsing what real judges write --------------------------------------------------------------------

RELEVANCE_OUTPUTS = [
    ("The documents name the director.\nRelevance: 0.8", 0.8),
    ("Relevance: 0.70", 0.7),
    ("relevance score = 0.35", 0.35),
    ("Relevance: 0.7/1", 0.7),
    ("Relevance: 7/10", 0.7),
    ("Relevance: 70%", 0.7),
    ("**Relevance:** **0.8**", 0.8),
    ("They help a little.\n\n**0.3**", 0.3),
    ("Score: 9", 0.9),
    ("Relevance: 1.00 (they answer it directly)", 1.0),
    ("Relevance: 0.4\n...on reflection...\nRelevance: 0.6", 0.6),  # the last score counts
    ("Relevance: .5", 0.5),
    ("Relevance: 140", None),  # no sensible scale
    ("Relevance: 0,8", 0.8),  # a decimal comma
    ("Relevance: 0.9\n(document [2] on its own would score 0)", 0.9),  # "Relevance" outranks prose about scores
    ("Score: 4/5 stars. Relevance: high", 0.8),
    ("The documents are somewhat relevant.", None),  # a missing score
    ("I'd say 0.9 overall, but it depends.", None),  # a number in prose is not a score line
    ("", None),
]


@pytest.mark.parametrize(("text", "expected"), RELEVANCE_OUTPUTS)
def test_relevance_parsing(text, expected):
    assert parse_relevance(text) == (pytest.approx(expected) if expected is not None else None)


def test_snapping_to_tenths_and_analysis():
    assert parse_relevance("Relevance: 0.66", snap_to_tenths=True) == pytest.approx(0.7)
    assert analysis_of("They name the director.\nRelevance: 0.8") == "They name the director."


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The prediction names the same person.\nCorrect: True", True),
        ("Correct: False", False),
        ("**Correct:** **True**", True),
        ("correctness: yes", True),
        ("Verdict: no", False),
        ("Both name Paris.\nTrue", True),
        ("Correct: Truely", None),
        ("Correct: True or False? False", None),  # not a verdict that ends its line
        ("**Correct:** **False**.", False),
        ("I cannot tell.", None),
    ],
)
def test_correctness_parsing(text, expected):
    assert parse_correctness(text) is expected


# -- the lexical judge ---------------------------------------------------------------------------------


def test_lexical_judge_rules():
    judge = LexicalJudge()
    on_topic = RelevanceItem(
        "Who directed Silent Harbor?",
        "Who directed Silent Harbor?",
        ["Silent Harbor is a 1955 film directed by Marta Kell."],
    )
    off_topic = RelevanceItem(
        "Who directed Silent Harbor?", "Who directed Silent Harbor?", ["Varholm is a city in Valdoria."]
    )
    assert judge.relevance_score(on_topic) == 1.0 and judge.relevance_score(off_topic) == 0.0
    assert judge.correct(CorrectnessItem("q", "It was Marta Kell.", ["Marta Kell"]))
    assert judge.correct(CorrectnessItem("q", "March 12, 1921", ["12 March 1921"]))
    assert not judge.correct(CorrectnessItem("q", "not known", ["no"]))
    results = asyncio.run(judge.correctness([CorrectnessItem("q", "Paris", ["Rome"])]))
    assert results[0].score == 0.0 and results[0].backend == "lexical" and not results[0].fallback


# -- the service ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def policy_tokenizer_dir(bpe_backend, tmp_path_factory):
    folder = tmp_path_factory.mktemp("policy-tokenizer")
    make_tokenizer(bpe_backend, CHATML_TEMPLATE).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def standin():
    with ServiceProcess([], script=STANDIN) as judge:
        yield judge


@pytest.fixture(autouse=True)
def judge_mode_ok(request):
    yield
    if "standin" in request.fixturenames:
        httpx.post(request.getfixturevalue("standin").url + "/control", json={"mode": "ok", "latency": 0.0})


def metric(service, sample: str) -> float:
    """The value of one Prometheus sample line (0 when it has not been counted yet)."""
    for line in httpx.get(service.url + "/metrics").text.splitlines():
        if line.startswith(sample + " "):
            return float(line.split()[-1])
    return 0.0


def control(standin, **settings) -> dict:
    return httpx.post(standin.url + "/control", json=settings).json()


def calls(standin) -> int:
    return httpx.get(standin.url + "/stats").json()["calls"]


def reward_config(path: Path, standin, policy_tokenizer_dir, cache: Path | None = None, **service) -> Path:
    config = {
        "judge": {
            "backend": "openai",
            "base_url": standin.url + "/v1",
            "model": "standin-judge",
            "timeout_s": 1.5,
            "retries": 1,
            "backoff_s": 0.05,
            "max_in_flight": 16,
            "cache_path": str(cache or ""),
        },
        "reward": {"policy_tokenizer": str(policy_tokenizer_dir), "max_steps": 5},
        "service": {"max_items": 200, "max_body_bytes": 200_000, **service},
    }
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture(scope="module")
def server(standin, policy_tokenizer_dir, tmp_path_factory):
    path = reward_config(tmp_path_factory.mktemp("reward") / "reward.yaml", standin, policy_tokenizer_dir)
    with ServiceProcess(["reward", "serve", "--config", str(path)]) as service:
        yield service


def post(service, path: str, body, **kwargs) -> httpx.Response:
    return httpx.post(service.url + path, json=body, timeout=60, **kwargs)


def relevance_items(n: int, tag: str = "") -> list[dict]:
    return [
        {
            "question": f"Who directed Silent Harbor? {tag}{i}",
            "analysis": "I need the director.",
            "query": "Silent Harbor film",
            "documents": ["Silent Harbor is a film directed by Marta Kell.", {"title": "Varholm", "text": "A city."}],
        }
        for i in range(n)
    ]


def test_relevance_endpoint(server, standin):
    rows = post(server, "/relevance", {"items": relevance_items(3, "rel")}).json()["results"]
    assert len(rows) == 3
    assert all(r["backend"] == "openai:standin-judge" and not r["fallback"] and 0 <= r["score"] <= 1 for r in rows)
    assert rows[0]["score"] == pytest.approx(1.0)  # every query word appears in the documents
    assert rows[0]["analysis"].startswith("The documents cover")


def test_correctness_tries_string_match_before_the_judge(server, standin):
    before = calls(standin)
    rows = post(
        server,
        "/correctness",
        {
            "items": [
                {"question": "Who?", "prediction": "It was Marta Kell.", "golden_answers": ["Marta Kell"]},
                {"question": "Who?", "prediction": "Kell, Marta", "golden_answers": ["Marta Kell"]},
                {"question": "Who?", "prediction": "Anna Berg", "golden_answers": ["Marta Kell"]},
                {"question": "Who?", "prediction": "  ", "golden_answers": ["Marta Kell"]},
            ]
        },
    ).json()["results"]
    assert [r["method"] for r in rows] == ["match", "judge", "judge", "empty"]
    assert [r["correct"] for r in rows] == [True, True, False, False]
    assert calls(standin) - before == 2


@pytest.mark.parametrize(
    ("mode", "reason", "judge_calls"),
    [
        ("error", "judge_unavailable", 2),  # 500, retried once
        ("slow", "judge_unavailable", 2),  # timed out, retried once
        ("garbage", "unparseable", 2),  # no score, asked once more
        ("notjson", "judge_unavailable", 1),  # 200 with a body that is not JSON
    ],
)
def test_judge_failures_are_flagged_fallbacks_without_missing_rows(server, standin, mode, reason, judge_calls):
    control(standin, mode=mode, reset=True)
    rows = post(server, "/relevance", {"items": relevance_items(2, mode)}).json()["results"]
    assert len(rows) == 2
    assert all(r["fallback"] and r["score"] == 0.0 and r["reason"].startswith(reason) for r in rows)
    verdicts = post(
        server,
        "/correctness",
        {"items": [{"question": "Who?", "prediction": f"Anna Berg {mode}", "golden_answers": ["Marta Kell"]}]},
    ).json()["results"]
    assert verdicts[0]["method"] == "fallback" and verdicts[0]["correct"] is False
    assert calls(standin) == 3 * judge_calls
    assert metric(server, f'r3rag_reward_fallbacks_total{{kind="relevance",reason="{reason}"}}') >= 2


def test_a_reply_without_a_score_is_asked_once_more(server, standin):
    failures = 'r3rag_reward_parse_failures_total{kind="relevance"}'
    before = metric(server, failures)
    control(standin, mode="flaky", reset=True)
    [row] = post(server, "/relevance", {"items": relevance_items(1, "flaky")}).json()["results"]
    assert not row["fallback"] and row["extra"]["attempts"] == 2 and calls(standin) == 2
    assert metric(server, failures) - before == 1


def test_identical_items_in_flight_are_judged_once(server, standin):
    control(standin, latency=0.3, reset=True)
    same = relevance_items(1, "dedup") * 8
    rows = post(server, "/relevance", {"items": same}).json()["results"]
    assert len(rows) == 8 and len({r["score"] for r in rows}) == 1
    assert calls(standin) == 1


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/relevance", {"items": [{"question": "q", "documents": []}]}, "query"),
        ("/relevance", {"items": []}, "items"),
        ("/correctness", {"items": [{"question": "q", "prediction": "p"}]}, "golden_answers"),
        ("/correctness", {"items": [{"question": "q", "prediction": "p", "golden_answers": "x"}]}, "golden_answers"),
        ("/get_reward", {"prompts": ["p"]}, "query"),
    ],
)
def test_malformed_requests_get_a_422_naming_the_field(server, path, body, field):
    response = post(server, path, body)
    assert response.status_code == 422
    assert any(field in map(str, error["loc"]) for error in response.json()["detail"])


def test_limits(server):
    response = post(server, "/relevance", {"items": relevance_items(1) * 201})
    assert response.status_code == 422 and "max_items=200" in response.text
    huge = post(server, "/relevance", {"items": [{"question": "q", "query": "x" * 300_000, "documents": []}]})
    assert huge.status_code == 413 and "max_body_bytes=200000" in huge.text
    assert httpx.get(server.url + "/health").json()["status"] == "ok"


def test_a_thousand_requests_from_fifty_clients(server, standin):
    async def run() -> list[int]:
        async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=50)) as client:
            queue = list(range(1000))
            statuses: list[int] = []

            async def worker() -> None:
                while queue:
                    i = queue.pop()
                    body = {"items": [{"question": f"q{i}", "query": f"film number {i}", "documents": [f"film {i}"]}]}
                    response = await client.post(server.url + "/relevance", json=body)
                    statuses.append(response.status_code)
                    assert len(response.json()["results"]) == 1

            await asyncio.gather(*(worker() for _ in range(50)))
            return statuses

    statuses = asyncio.run(run())
    assert len(statuses) == 1000 and set(statuses) == {200}


# -- /get_reward: OpenRLHF's remote reward protocol ------------------------------------------------------

DOCS = [
    Passage.from_title_text("1", "Silent Harbor", "Silent Harbor is a 1955 film directed by Marta Kell."),
    Passage.from_title_text("2", "Marta Kell", "Marta Kell was born in Varholm."),
]
QUESTION = "Where was the director of Silent Harbor born?"
LABEL = json.dumps({"golden_answers": ["Varholm"], "question": QUESTION})

TRAJECTORIES = {
    "correct": [
        Turn(Step("I need the director.", query="director of Silent Harbor"), DOCS[:1]),
        Turn(Step("Marta Kell directed it; now her birthplace.", query="Marta Kell birthplace"), DOCS[1:]),
        Turn(Step("She was born in Varholm.", answer="Varholm")),
    ],
    "wrong": [
        Turn(Step("I need the director.", query="director of Silent Harbor"), DOCS[:1]),
        Turn(Step("Probably a big city.", answer="Ostrava")),
    ],
    "no_answer": [Turn(Step(f"Still searching {i}.", query=f"Silent Harbor crew {i}"), DOCS[:1]) for i in range(5)],
}


def transcript(renderer: ChatRenderer, turns: list[Turn], broken_last: str | None = None) -> tuple[str, str]:
    prompt = renderer.prompt(QUESTION)
    text = renderer.transcript(QUESTION, turns)
    if broken_last is not None:
        text += broken_last + renderer.frame.turn_end
    return text, prompt


def test_get_reward_scores_each_outcome_with_the_r3_scheme(server, policy_tokenizer_dir):
    from transformers import AutoTokenizer

    renderer = ChatRenderer(AutoTokenizer.from_pretrained(policy_tokenizer_dir))
    cases = {name: transcript(renderer, turns) for name, turns in TRAJECTORIES.items()}
    cases["format_error"] = transcript(renderer, TRAJECTORIES["correct"][:1], broken_last="I think it is Varholm.")
    names = list(cases)
    answer = post(
        server,
        "/get_reward",
        {
            "query": [cases[n][0] for n in names],
            "prompts": [cases[n][1] for n in names],
            "labels": [LABEL] * len(names),
        },
    ).json()
    assert answer["outcomes"] == names
    assert set(answer) >= {"rewards", "scores", "extra_logs"} and len(answer["rewards"]) == len(names)
    assert answer["extra_logs"]["correct"] == [1.0, 0.0, 0.0, 0.0]
    assert answer["extra_logs"]["num_steps"] == [3.0, 2.0, 5.0, 2.0]
    # the same relevance the /relevance endpoint gives, combined by the r3 scheme
    scheme = get_scheme("r3")
    for name in names:
        turns = TRAJECTORIES.get(name, TRAJECTORIES["correct"][:1])
        queries = [t for t in turns if not t.step.is_final]
        items = [
            {
                "question": QUESTION,
                "analysis": t.step.analysis,
                "query": t.step.query,
                "documents": [
                    renderer.format.parse_documents(renderer.format.render_documents(t.documents, 1, 512))[j].contents
                    for j in range(len(t.documents))
                ],
            }
            for t in queries
        ]
        rel = [r["score"] for r in post(server, "/relevance", {"items": items}).json()["results"]] if items else []
        expected = scheme.step_rewards(Episode(Outcome(name), rel))
        position = names.index(name)
        assert answer["step_rewards"][position] == pytest.approx(expected), name
        assert answer["rewards"][position] == pytest.approx(sum(expected))
    assert answer["step_rewards"][names.index("correct")][-1] == 2.0
    assert answer["step_rewards"][names.index("format_error")][-1] == pytest.approx(-0.9)


def test_get_reward_unreadable_transcripts_get_a_neutral_reward(server):
    answer = post(
        server,
        "/get_reward",
        {
            "query": ["something else entirely", "x"],
            "prompts": ["my prompt", "x"],
            "labels": [LABEL, json.dumps({"golden_answers": []})],
        },
    ).json()
    assert answer["outcomes"] == ["unreadable", "unreadable"] and answer["rewards"] == [0.0, 0.0]
    response = post(server, "/get_reward", {"query": ["a", "b"], "prompts": ["a"], "labels": [LABEL, LABEL]})
    assert response.status_code == 422 and "prompts must list one entry per query" in response.text


def test_get_reward_needs_the_policy_tokenizer(standin, tmp_path):
    path = tmp_path / "reward.yaml"
    path.write_text(yaml.safe_dump({"judge": {"backend": "lexical"}}))
    with ServiceProcess(["reward", "serve", "--config", str(path)]) as service:
        response = post(service, "/get_reward", {"query": ["q"], "prompts": ["q"], "labels": ["a"]})
        assert response.status_code == 503 and "reward.policy_tokenizer" in response.text
        assert httpx.get(service.url + "/health").json()["judge"] == "lexical"


def test_auth_on(standin, policy_tokenizer_dir, tmp_path):
    path = reward_config(tmp_path / "reward.yaml", standin, policy_tokenizer_dir, api_key="k3y")
    with ServiceProcess(["reward", "serve", "--config", str(path)]) as service:
        body = {"items": relevance_items(1, "auth")}
        assert post(service, "/relevance", body).status_code == 401
        assert post(service, "/relevance", body, headers={"Authorization": "Bearer k3y"}).status_code == 200
        assert httpx.get(service.url + "/health").status_code == 200


def test_the_cache_survives_a_restart(standin, policy_tokenizer_dir, tmp_path):
    cache = tmp_path / "judgements.sqlite"
    path = reward_config(tmp_path / "reward.yaml", standin, policy_tokenizer_dir, cache=cache)
    body = {"items": relevance_items(3, "cached")}
    control(standin, reset=True)
    with ServiceProcess(["reward", "serve", "--config", str(path)]) as service:
        first = post(service, "/relevance", body).json()["results"]
    assert calls(standin) == 3 and not any(r["cached"] for r in first)
    with ServiceProcess(["reward", "serve", "--config", str(path)]) as service:
        second = post(service, "/relevance", body).json()["results"]
        metrics = httpx.get(service.url + "/metrics").text
    assert calls(standin) == 3 and all(r["cached"] for r in second)
    assert [r["score"] for r in second] == [r["score"] for r in first]
    assert 'r3rag_reward_cache_hits_total{kind="relevance"} 3.0' in metrics


def test_config_errors_are_clear(tmp_path):
    path = tmp_path / "reward.yaml"
    path.write_text(yaml.safe_dump({"judges": {"backend": "lexical"}}))
    result = run_r3rag("reward", "serve", "--config", str(path))
    assert result.returncode == 2 and "unknown key 'judges'; valid keys: judge, reward, service" in result.stderr
    result = run_r3rag("reward", "serve", "--judge.backend", "local")
    assert result.returncode == 2 and "judge.model_path is required" in result.stderr
    result = run_r3rag("reward", "serve", "--reward.scheme_options", '{"bogus": 1}')
    assert result.returncode == 2 and "scheme_options do not fit" in result.stderr
    result = run_r3rag("reward", "serve", "--reward.scheme", "gold_hit")
    assert result.returncode == 2 and "use r3rag's agent" in result.stderr


def test_local_transformers_judge_plumbing(bpe_backend, tmp_path):
    """A tiny random model can only babble: this shows the local backend runs end to end and is flagged."""
    folder = save_tiny_causal_lm(tmp_path / "tiny", make_tokenizer(bpe_backend, CHATML_TEMPLATE))
    config = JudgeConfig(backend="local", model_path=str(folder), max_tokens=12)
    judge = LLMJudge(LocalHFBackend(str(folder), device="cpu", max_tokens=12), config, RewardMetrics())
    [row] = asyncio.run(judge.relevance([RelevanceItem("Who?", "director", ["Marta Kell directed it."])]))
    assert row.backend == f"local:{folder}"
    assert row.fallback == (row.reason.startswith("unparseable")) and 0.0 <= row.score <= 1.0


def test_launch_script_dry_run_resolves_commands_the_cli_accepts():
    from r3_env.cli import build_parser

    env = {**os.environ, "JUDGE_MODEL": "Qwen/Qwen2.5-7B-Instruct", "CONFIG": "reward.yaml", "JUDGE_TP": "2"}
    out = subprocess.run(
        ["bash", "launch/serve_reward.sh", "--dry-run", "--judge.cache_path", "c.sqlite"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    judge, reward = (line.split() for line in out)
    assert judge[:3] == ["vllm", "serve", "Qwen/Qwen2.5-7B-Instruct"] and "--tensor-parallel-size" in judge
    assert judge[judge.index("--tensor-parallel-size") + 1] == "2" and judge[judge.index("--host") + 1] == "127.0.0.1"
    args = build_parser().parse_args(reward[1:])
    assert getattr(args, "judge.base_url") == "http://127.0.0.1:8001/v1"
    assert getattr(args, "judge.model") == "Qwen/Qwen2.5-7B-Instruct"
    assert getattr(args, "judge.cache_path") == "c.sqlite" and args.config == "reward.yaml"


def test_launch_script_waits_for_the_judge_then_serves(standin, tmp_path):
    """The real script, with JUDGE_URL set to a running judge (the stand-in): no vLLM is started."""
    port = free_port()
    env = {
        **os.environ,
        "JUDGE_URL": standin.url + "/v1",
        "JUDGE_MODEL": "standin-judge",
        "PORT": str(port),
        "HOST": "127.0.0.1",
        "R3RAG": str(Path(sys.executable).parent / "r3rag"),
    }
    process = subprocess.Popen(
        ["bash", "launch/serve_reward.sh"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(300):
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        rows = httpx.post(url + "/relevance", json={"items": relevance_items(1, "launch")}, timeout=30).json()
        assert rows["results"][0]["backend"] == "openai:standin-judge" and not rows["results"][0]["fallback"]
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=30)


def test_odd_labels_and_truncated_steps(server, policy_tokenizer_dir):
    from transformers import AutoTokenizer

    renderer = ChatRenderer(AutoTokenizer.from_pretrained(policy_tokenizer_dir))
    good, prompt = transcript(renderer, TRAJECTORIES["correct"])
    cut = good[: good.rindex(renderer.frame.turn_end)][:-3]  # the final answer lost its stop token and 3 chars
    labels = [None, "null", json.dumps({"golden_answers": None}), [], ["Varholm"], LABEL]
    queries = [good] * 5 + [cut]
    answer = post(server, "/get_reward", {"query": queries, "prompts": [prompt] * 6, "labels": labels}).json()
    assert answer["outcomes"] == ["unreadable"] * 4 + ["correct", "format_error"]
    assert answer["rewards"][:4] == [0.0] * 4 and answer["extra_logs"]["unreadable"] == [1.0] * 4 + [0.0, 0.0]
    assert answer["step_rewards"][5][-1] == pytest.approx(-0.9)


def test_a_judge_that_outlasts_the_deadline_falls_back(standin):
    config = JudgeConfig(base_url=standin.url + "/v1", model="standin-judge", timeout_s=20, retries=0, deadline_s=0.5)
    judge = LLMJudge(OpenAIChatBackend(config.base_url, config.model, timeout_s=20, retries=0), config, RewardMetrics())
    control(standin, mode="slow")
    started = time.time()
    [row] = asyncio.run(judge.relevance([RelevanceItem("Who?", "Silent Harbor film", ["Silent Harbor"])]))
    assert row.fallback and row.reason.startswith("deadline") and time.time() - started < 5


def test_a_cancelled_requester_does_not_cancel_the_others_waiting(standin):
    config = JudgeConfig(base_url=standin.url + "/v1", model="standin-judge")
    control(standin, latency=0.5, reset=True)

    async def run():
        judge = LLMJudge(OpenAIChatBackend(config.base_url, config.model), config, RewardMetrics())
        item = [RelevanceItem("Who?", "Silent Harbor film", ["Silent Harbor is a film."])]
        first = asyncio.ensure_future(judge.relevance(item))
        await asyncio.sleep(0.1)
        second = asyncio.ensure_future(judge.relevance(item))
        await asyncio.sleep(0.1)
        first.cancel()
        result = await second
        await judge.close()
        return result

    [row] = asyncio.run(run())
    assert not row.fallback and row.score == pytest.approx(1.0) and calls(standin) == 1


def test_the_cache_key_covers_the_judge_settings(standin, tmp_path):
    from reward_server.cache import JudgementCache

    item = [RelevanceItem("Who?", "Silent Harbor movie", ["Silent Harbor is a film."])]  # 2 of 3 words: 0.67
    control(standin, reset=True)
    for snap in (False, True, True):
        config = JudgeConfig(base_url=standin.url + "/v1", model="standin-judge", snap_to_tenths=snap)
        judge = LLMJudge(
            OpenAIChatBackend(config.base_url, config.model),
            config,
            RewardMetrics(),
            JudgementCache(tmp_path / "cache.sqlite"),
        )

        async def once(judge=judge):
            [row] = await judge.relevance(item)
            await judge.close()
            return row

        row = asyncio.run(once())
        assert row.score == pytest.approx(0.7 if snap else 0.67, abs=0.01)
    assert calls(standin) == 2, "snapping changed the key once; the third judgement came from the cache"


def test_health_reports_whether_the_judge_serves_the_model(server, standin, policy_tokenizer_dir, tmp_path):
    assert httpx.get(server.url + "/health").json()["judge_status"] == {
        "reachable": True,
        "model_listed": True,
        "models": ["standin-judge"],
    }
    path = reward_config(tmp_path / "reward.yaml", standin, policy_tokenizer_dir)
    with ServiceProcess(["reward", "serve", "--config", str(path), "--judge.model", "no-such-model"]) as service:
        status = httpx.get(service.url + "/health").json()["judge_status"]
        assert status["reachable"] and status["model_listed"] is False
        assert "judge openai:no-such-model is not ready" in service.read_log()


def test_transcripts_are_read_with_the_formats_position_rules(bpe_backend):
    """The reward server's format verdict is the environment's: after documents a tags search needs a reflection."""
    renderer = ChatRenderer(make_tokenizer(bpe_backend, CHATML_TEMPLATE), "tags")
    question = "Where was the director of Silent Harbor born?"
    documents = [Passage.from_title_text("1", "Silent Harbor", "Directed by Marta Kell.")]
    first = Turn(Step("I need the director.", query="Silent Harbor director"), documents)
    label = json.dumps({"golden_answers": ["Oslo"], "question": question})
    prompt = renderer.prompt(question)
    for second, error in (
        (Step("Her birthplace next.", query="Marta Kell birthplace", reflection="It names Marta Kell."), None),
        (Step("Her birthplace next.", query="Marta Kell birthplace"), "missing_reflection"),
    ):
        transcript = renderer.transcript(question, [first, Turn(second, documents)])
        parsed = parse_transcript(renderer, transcript, prompt, label, max_steps=5)
        assert parsed.format_error == error and len(parsed.steps) == (2 if error is None else 1)
