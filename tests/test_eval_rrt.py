"""``r3rag eval run --method rrt``: R2AG's retrieval tree steered by the evaluation engine, then a reader.

A real tiny transformer (HFEngine, its decoding scripted) steers the tree in the ``multi_query``
format against the real retrieval service (BM25 over the generated world): one question goes hop by
hop, one asks both hops at once with a predicted query, one writes a broken step. The script names
the questions' gold hop sub-questions (metadata.question_decomposition), so the tree finds the gold.
Then single-shot retrieval at the tree's @K, the scores, and the report's retrieval table.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from conftest import ServiceProcess, answer_step, run_r3rag, scripted_engine

from eval.engines import EngineConfig, GenerationConfig
from eval.report import write_report
from eval.run import EvalRunConfig, run_eval
from eval.score import ScoreConfig, score_run
from r3_env.data import iter_corpus, iter_jsonl, write_dataset
from r3_env.env import EnvConfig
from r3_env.protocol import Step, get_format
from r3_env.retrieval import load_retriever
from r3_env.retrieval.client import AsyncRetrievalClient
from r3_env.retrieval.config import RetrieverConfig
from r3_env.retrieval.metrics import retrieval_quality
from r3_env.runs import JudgeClientConfig, RetrievalSource
from r3_env.tree import Tree, tree_metrics

FORMAT = get_format("multi_query")
STEERING = "You steer a search engine"  # the multi_query system prompt's opening: a steering prompt, not the reader's
PREDICTED = "Marta Kell birthplace"


class TreeScript:
    """HFEngine's script: steering prompts get ``policies[question](prompt)``, reader prompts the golden answer
    (or ``wrong``). Every prompt is kept."""

    def __init__(self, tokenizer, policies: dict, answers: dict) -> None:
        self.tokenizer, self.policies, self.answers = tokenizer, policies, answers
        self.prompts: list[tuple[str, str, str]] = []  # (question, "steer" or "read", prompt text)

    def __call__(self, prompt_ids):
        text = self.tokenizer.decode(prompt_ids, skip_special_tokens=False)
        question = next((q for q in self.policies if f"Question: {q}" in text), None)
        if question is None:
            return None
        kind = "steer" if STEERING in text else "read"
        self.prompts.append((question, kind, text))
        output = (
            self.policies[question](text)
            if kind == "steer"
            else answer_step("From the documents.", self.answers[question])
        )
        return self.tokenizer(output, add_special_tokens=False)["input_ids"]


def shown(text: str, passage) -> bool:
    """Whether ``passage`` is one of the numbered documents in ``text``."""
    return f"] {passage.title}\n" in text


class CountingClient:
    """The real retrieval service's client, counting batched calls."""

    def __init__(self, url: str) -> None:
        self.client, self.calls = AsyncRetrievalClient(url), []

    async def search(self, queries, k):
        self.calls.append((list(queries), k))
        return await self.client.search(queries, k)

    async def aclose(self) -> None:
        await self.client.aclose()


@pytest.fixture(scope="module")
def setting(eval_world, tmp_path_factory):
    """Three 2-hop world questions whose hop sub-questions each find their gold passage at BM25 top-1."""
    import yaml

    index = yaml.safe_load(Path(eval_world["retriever"]).read_text())["index_path"]
    retriever = load_retriever(RetrieverConfig(retrieval_method="bm25", index_path=index))
    passages = {p.id: p for p in iter_corpus(eval_world["root"] / "world" / "corpus.jsonl")}
    chosen = []
    for item in eval_world["items"]:
        hops = item.metadata["question_decomposition"]
        if item.metadata["hops"] != 2:
            continue
        top = retriever.search([hop["question"] for hop in hops], 1)
        if all(found[0].passage.id == hop["passage_id"] for found, hop in zip(top, hops, strict=True)):
            chosen.append(item)
        if len(chosen) == 3:
            break
    assert len(chosen) == 3
    data = tmp_path_factory.mktemp("rrt") / "world" / "dev.jsonl"
    write_dataset(data, chosen)
    yield {"items": chosen, "data": data, "passages": passages, "retriever": retriever}
    retriever.close()


def policies(setting) -> dict:
    """hop: one hop per step until both gold passages are on the path; parallel: both hops and a predicted
    query at the root, then stop; broken: an unclosed think block."""
    hop_item, parallel_item, broken_item = setting["items"]

    def hops(item):
        return [(h["question"], setting["passages"][h["passage_id"]]) for h in item.metadata["question_decomposition"]]

    def hop_by_hop(text: str) -> str:
        missing = [query for query, passage in hops(hop_item) if not shown(text, passage)]
        if not missing:
            return FORMAT.render_step(Step("Both facts are in the documents.", stop=True))
        return FORMAT.render_step(Step(f"{len(missing)} fact(s) missing.", queries=(missing[0],)))

    def parallel(text: str) -> str:
        if "Documents found so far" in text:
            return FORMAT.render_step(Step("Enough.", stop=True))
        queries = tuple(query for query, _ in hops(parallel_item))
        return FORMAT.render_step(Step("Two independent facts.", queries=queries, predicted=(PREDICTED,)))

    return {
        hop_item.question: hop_by_hop,
        parallel_item.question: parallel,
        broken_item.question: lambda text: "<think>no queries here",
    }


def test_rrt_run_scores_and_reports_beside_single_shot(setting, eval_world, eval_tiny, tmp_path):
    hop_item, parallel_item, broken_item = items = setting["items"]
    retriever = setting["retriever"]
    answers = {
        hop_item.question: hop_item.golden_answers[0],
        parallel_item.question: parallel_item.golden_answers[0],
        broken_item.question: "Nobody In Particular",
    }
    engine = scripted_engine(eval_tiny, {})
    script = engine.generator.script = TreeScript(engine.tokenizer, policies(setting), answers)
    out = tmp_path / "runs" / "rrt"
    config = EvalRunConfig(data=str(setting["data"]), out=str(out), method="rrt", concurrency=1)

    with ServiceProcess(["retriever", "serve", "--config", eval_world["retriever"]]) as service:
        source = RetrievalSource(url=service.url)
        client = CountingClient(service.url)

        def run(run_config, **kw):
            return asyncio.run(
                run_eval(run_config, EnvConfig(), EngineConfig(model=str(eval_tiny)), GenerationConfig(), source, **kw)
            )

        stats = run(config, engine=engine, retriever=client)
        assert (stats.done, stats.failed) == (3, 0)
        rows = {row["question"]: row for _, row in iter_jsonl(out / "predictions.jsonl")}

        # -- the trees ------------------------------------------------------------------------------
        hop_hops = hop_item.metadata["question_decomposition"]
        par_hops = parallel_item.metadata["question_decomposition"]
        predicted_doc = retriever.search([PREDICTED], 1)[0][0].passage.id
        # one batched /retrieve call per iteration that has queries, each with all of that iteration's queries
        assert client.calls == [
            ([hop_hops[0]["question"]], 1),
            ([hop_hops[1]["question"]], 1),
            ([par_hops[0]["question"], par_hops[1]["question"], PREDICTED], 1),
        ]

        hop = rows[hop_item.question]
        tree = Tree.from_json(hop["tree"])
        assert [(v.kind, v.depth, v.query) for v in tree.vertices] == [
            ("root", 0, hop_item.question),
            ("base", 1, hop_hops[0]["question"]),
            ("base", 2, hop_hops[1]["question"]),
        ]
        assert [v.new_gold for v in tree.vertices] == [[], [hop_hops[0]["passage_id"]], [hop_hops[1]["passage_id"]]]
        assert tree.complete and tree.iterations == 3 and tree.vertices[2].stop  # the third step stopped
        assert hop["retrieval"] == tree_metrics(tree)
        assert {k: hop["retrieval"][k] for k in ("recall", "full_recall", "average_precision", "num_docs")} == {
            "recall": 1.0,
            "full_recall": 1.0,
            "average_precision": 1.0,
            "num_docs": 2.0,
        }
        assert hop["retrieval"]["iterations"] == 3 and hop["retrieval"]["generation_s"] > 0
        assert hop["retrieval"]["retrieval_s"] > 0
        assert (hop["num_steps"], hop["num_retrievals"], hop["num_docs"]) == (3, 2, 2)
        assert [s.get("query") for s in hop["steps"]] == [hop_hops[0]["question"], hop_hops[1]["question"], None]
        assert [s.get("depth") for s in hop["steps"][:2]] == [1, 2]
        assert (
            hop["steps"][0]["analysis"] == "2 fact(s) missing." and hop["steps"][1]["analysis"] == "1 fact(s) missing."
        )
        assert hop["usage"]["requests"] == 4  # three steering steps and the reader

        par = rows[parallel_item.question]
        tree = Tree.from_json(par["tree"])
        assert [(v.kind, v.depth, v.survived) for v in tree.vertices[1:]] == [
            ("base", 1, True),
            ("base", 1, True),
            ("predicted", 1, True),
        ]
        expanded = [v for v in tree.vertices if v.expanded]  # the root, then each child with new documents
        assert len(expanded) == 1 + len({hop["passage_id"] for hop in par_hops} | {predicted_doc})
        retrieved = list(dict.fromkeys([par_hops[0]["passage_id"], par_hops[1]["passage_id"], predicted_doc]))
        assert [p.id for p in tree.retrieved()] == retrieved and tree.iterations == 2
        assert par["retrieval"] == tree_metrics(tree)
        assert par["retrieval"]["recall"] == par["retrieval"]["full_recall"] == 1.0
        assert par["retrieval"]["average_precision"] == 1.0  # both gold first
        assert (par["num_steps"], par["num_retrievals"], par["num_docs"]) == (2, 3, len(retrieved))
        assert par["steps"][0]["analysis"] == "Two independent facts." and par["steps"][1]["analysis"] == ""

        broken = rows[broken_item.question]
        tree = Tree.from_json(broken["tree"])
        assert tree.root.format_error == "unclosed_tag" and len(tree.vertices) == 1
        assert broken["retrieval"]["num_docs"] == 0 and broken["retrieval"]["recall"] == 0
        assert (broken["num_steps"], broken["num_retrievals"], broken["num_docs"]) == (1, 0, 0)

        # -- the prompts: steering in multi_query with the run's limits; the reader in r3 with every document ---
        steering = [
            text for question, kind, text in script.prompts if kind == "steer" and question == hop_item.question
        ]
        assert len(steering) == 3 and all("up to 4 base queries" in text for text in steering)
        assert "Documents found so far" not in steering[0] and shown(
            steering[2], setting["passages"][hop_hops[1]["passage_id"]]
        )
        [reader] = [
            text for question, kind, text in script.prompts if kind == "read" and question == parallel_item.question
        ]
        titles = [setting["passages"][doc].title for doc in retrieved]
        positions = [reader.index(f"] {title}\n") for title in titles]
        assert positions == sorted(positions) and "Retrieved documents for step 1:" in reader
        assert "The final answer:" in reader  # the r3 format's answer-only instructions

        # -- the reader's answers -------------------------------------------------------------------------
        assert hop["answer"] == hop_item.golden_answers[0] and hop["answer_source"] == "format"
        assert par["prediction"] == parallel_item.golden_answers[0]
        assert broken["answer"] == "Nobody In Particular"
        [broken_reader] = [t for q, k, t in script.prompts if k == "read" and q == broken_item.question]
        assert "(no documents were found)" in broken_reader

        manifest = json.loads((out / "run.json").read_text())
        assert manifest["method"] == "rrt" and manifest["step_format"] == "multi_query"
        assert manifest["reader_format"] == "r3" and manifest["retriever"] == "bm25"
        assert manifest["tree"] == {
            "topk": 1,
            "max_iterations": 5,
            "survivors_base": 4,
            "survivors_predicted": 2,
            "max_frontier": 16,
            "max_base": 4,
            "max_predicted": 2,
        }

        # -- a rerun with other tree settings is refused; the same settings resume -------------------------
        from dataclasses import replace

        with pytest.raises(ValueError, match=r"tree\.topk: 1 -> 2.*choose another --out"):
            run(replace(config, rrt_topk=2), engine=engine)
        with pytest.raises(ValueError, match=r"tree\.max_predicted: 2 -> 0"):
            run(replace(config, rrt_max_predicted=0), engine=engine)
        assert run(config, engine=engine).skipped == 3

        # -- single-shot retrieval at the tree's @K, as a user runs it ----------------------------------------
        at_k = (2 + len(retrieved) + 0) / 3
        k = int(at_k + 0.5)
        single = tmp_path / "runs" / "single"
        result = run_r3rag(
            "eval",
            "run",
            "--method",
            "single_shot",
            "--naive_topk",
            str(k),
            "--data",
            str(setting["data"]),
            "--out",
            str(single),
            "--retrieval.url",
            service.url,
        )
        assert result.returncode == 0, result.stderr[-2000:]

    shot_rows = {row["question"]: row for _, row in iter_jsonl(single / "predictions.jsonl")}
    shot_manifest = json.loads((single / "run.json").read_text())
    assert shot_manifest["model"] == "none" and shot_manifest["naive_topk"] == k and shot_manifest["answers"] is False
    expected_shot = {}
    for item in items:
        row = shot_rows[item.question]
        ranked = [hit.passage.id for hit in retriever.search([item.question], k)[0]]
        assert [d["id"] for d in row["steps"][0]["documents"]] == ranked and row["answer"] is None
        metrics = retrieval_quality(ranked, item.metadata["supporting_passage_ids"])
        assert {key: row["retrieval"][key] for key in metrics} == pytest.approx(metrics)
        expected_shot[item.question] = metrics

    # -- scores: the scorer's recall, full recall and AP are the tree's own -----------------------------------
    scores = asyncio.run(score_run(ScoreConfig(run=str(out)), JudgeClientConfig()))
    assert scores["cutoffs"] == [1, 2, 3, 4, 5]  # the tree's iterations (L_MAX), not env.max_steps
    per_question = {row["id"]: row for _, row in iter_jsonl(out / "question_scores.jsonl")}
    for row in rows.values():
        got = per_question[row["id"]]
        assert (got["recall"], got["full_recall"], got["ap"]) == pytest.approx(
            (row["retrieval"]["recall"], row["retrieval"]["full_recall"], row["retrieval"]["average_precision"])
        )
    final = scores["datasets"]["world"]["final"]
    assert final["em"] == pytest.approx(2 / 3) and final["answered"] == 1.0
    assert (final["recall"], final["full_recall"], final["map"]) == pytest.approx((2 / 3, 2 / 3, 2 / 3))
    assert final["avg_docs"] == pytest.approx(at_k) and final["iterations"] == pytest.approx(2.0)
    mean_s = {key: sum(row["retrieval"][key] for row in rows.values()) / 3 for key in ("retrieval_s", "generation_s")}
    assert (final["retrieval_s"], final["generation_s"]) == pytest.approx(
        (mean_s["retrieval_s"], mean_s["generation_s"])
    )
    by_two = scores["datasets"]["world"]["by_cutoff"]["2"]  # iterations 1-2: the hop question's second hop is in
    assert by_two["recall"] == pytest.approx(2 / 3) and by_two["em"] == pytest.approx(1 / 3)  # its answer is not
    printed = run_r3rag("eval", "score", "--run", str(single))
    assert printed.returncode == 0, printed.stderr[-2000:]
    from eval.score import format_scores

    assert f"single-shot retrieval at matched @K (--naive_topk per dataset): world {k}" in format_scores(scores)

    # -- the report: the tree beside single-shot retrieval at matched @K ----------------------------------------
    paths = write_report(tmp_path / "runs")
    tables = json.loads(paths["json"].read_text())
    rows_by_run = {row["run"]: row for row in tables["tree_retrieval"]}
    assert set(rows_by_run) == {"rrt (bm25)", "single_shot (bm25)"} and tables["tree_notes"] == []
    assert [row["run"] for row in tables["main"]] == ["rrt (bm25)"]  # single-shot retrieval answers nothing
    assert tables["retrieval"] == [] and [c["run"] for c in tables["steps_curves"]] == ["rrt (bm25)"]
    tree_cell = rows_by_run["rrt (bm25)"]["scores"]["world"]
    assert tree_cell == pytest.approx(
        {"recall": 2 / 3, "full_recall": 2 / 3, "map": 2 / 3, "avg_docs": at_k, "iterations": 2.0, **mean_s}
    )
    shot_cell = rows_by_run["single_shot (bm25)"]["scores"]["world"]
    mean = {
        key: sum(m[key] for m in expected_shot.values()) / 3 for key in ("recall", "full_recall", "average_precision")
    }
    assert shot_cell["recall"] == pytest.approx(mean["recall"]) and shot_cell["map"] == pytest.approx(
        mean["average_precision"]
    )
    assert shot_cell["full_recall"] == pytest.approx(mean["full_recall"])
    assert shot_cell["avg_docs"] == k and shot_cell["iterations"] == 1.0 and shot_cell["generation_s"] == 0.0
    assert rows_by_run["single_shot (bm25)"]["naive_topk"] == k

    markdown = paths["md"].read_text()
    assert "## Retrieval tree vs single-shot (R2AG)" in markdown
    titles = ("Recall", "Full-Recall", "mAP", "@K", "iterations", "retrieval s/q", "generation s/q")
    header = ["run"] + [f"{group} {title}" for group in ("world", "average") for title in titles]
    assert "| " + " | ".join(header) + " |" in markdown
    cells = f"66.7 | 66.7 | 66.7 | {at_k:.1f} | 2.00 | {mean_s['retrieval_s']:.3f} | {mean_s['generation_s']:.3f}"
    assert f"| rrt (bm25) | {cells} | {cells} |" in markdown
    shot = (
        f"{100 * mean['recall']:.1f} | {100 * mean['full_recall']:.1f} | {100 * mean['average_precision']:.1f} | "
        f"{k:.1f} | 1.00 | {shot_cell['retrieval_s']:.3f} | 0.000"
    )
    assert f"| single_shot (bm25) | {shot} | {shot} |" in markdown
    page = paths["html"].read_text()
    assert 'id="tree-retrieval-table"' in page and page.count("<tr><td title=") >= 3

    # without the matched single-shot run, the report says which one to make
    import shutil

    shutil.rmtree(single)
    tables = json.loads(write_report(tmp_path / "runs")["json"].read_text())
    assert tables["tree_notes"] == [
        f"rrt (bm25): no single-shot run on world at its @K {at_k:.1f}; "
        f"r3rag eval run --method single_shot --naive_topk {k} (over world)"
    ]
