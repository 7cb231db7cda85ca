"""Retrieval: real bm25s and faiss indexes, FlashRAG compatibility, the service on a real port, the client."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import yaml
from conftest import ServiceProcess, free_port, minilm_path, run_r3rag

from r3_env.data import Passage, iter_corpus
from r3_env.retrieval import RetrieverConfig, load_retriever, open_retriever
from r3_env.retrieval.base import Hit
from r3_env.retrieval.bm25 import BM25Retriever, IndexFormatError, build_bm25_index
from r3_env.retrieval.client import AsyncRetrievalClient, RetrievalClient, RetrievalServiceError
from r3_env.retrieval.config import default_instructions
from r3_env.retrieval.dense import EncodingSpec, build_dense_index, embedding_file, encode_corpus
from r3_env.retrieval.docstore import DocStore
from r3_env.retrieval.encoder import Encoder
from r3_env.retrieval.hybrid import reciprocal_rank_fusion
from r3_env.retrieval.index_builder import IndexBuildConfig, build_index
from r3_env.world import WorldConfig, generate_world


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A 400-entity world with a BM25 index and a MiniLM Flat index, as `r3rag index build` writes them."""
    root = tmp_path_factory.mktemp("retrieval")
    generate_world(WorldConfig(entities=400, seed=1, bm25_check=0), root / "world")
    corpus = root / "world" / "corpus.jsonl"
    bm25_dir = build_index(IndexBuildConfig(corpus_path=str(corpus), save_dir=str(root / "idx")))
    dense_file = build_index(
        IndexBuildConfig(
            retrieval_method="minilm",
            corpus_path=str(corpus),
            save_dir=str(root / "idx"),
            model_path=minilm_path(),
            sentence_transformer=True,
            batch_size=64,
        )
    )
    questions = [json.loads(line)["question"] for line in (root / "world" / "dev.jsonl").read_text().splitlines()]
    return {"root": root, "corpus": corpus, "bm25": bm25_dir, "dense": dense_file, "questions": questions[:40]}


def bm25_config(built, **extra) -> RetrieverConfig:
    return RetrieverConfig(retrieval_method="bm25", index_path=str(built["bm25"]), **extra)


def dense_config(built, **extra) -> RetrieverConfig:
    return RetrieverConfig(
        retrieval_method="minilm",
        index_path=str(built["dense"]),
        corpus_path=str(built["corpus"]),
        retrieval_model_path=minilm_path(),
        use_sentence_transformer=True,
        **extra,
    )


def ids(hits: list[list[Hit]]) -> list[list[str]]:
    return [[hit.passage.id for hit in row] for row in hits]


# -- indexes and in-process retrievers ---------------------------------------------------------------


def test_bm25_index_has_flashrag_layout_and_finds_named_entities(built):
    names = {p.name for p in built["bm25"].iterdir()}
    assert {
        "params.index.json",
        "vocab.index.json",
        "data.csc.index.npy",
        "corpus.jsonl",
        "vocab.tokenizer.json",
        "stopwords.tokenizer.json",
    } <= names
    passages = list(iter_corpus(built["corpus"]))
    with load_retriever(bm25_config(built)) as retriever:
        hits = retriever.search([p.title for p in passages[:30]], 3)
    assert sum(p.id in {h.passage.id for h in row} for p, row in zip(passages, hits, strict=False)) >= 28
    assert all(row[0].score >= row[-1].score for row in hits)


def test_bm25_query_of_stopwords_alone_finds_nothing_instead_of_failing(built):
    """A policy (or a baseline's generated thought) may search for "the of a": no hit, and the batch goes on."""
    title = next(iter_corpus(built["corpus"])).title
    with load_retriever(bm25_config(built)) as retriever:
        hits = retriever.search(["the of a", title, "", "?!"], 3)
    assert [len(row) for row in hits] == [0, 3, 0, 0] and hits[1][0].passage.title == title
    with load_retriever(bm25_config(built)) as retriever:
        assert retriever.search(["and the"], 3) == [[]]


@pytest.mark.parametrize("chosen, expected", [(None, "cpu"), ("", "")])
def test_bm25_keeps_jax_off_the_gpu_unless_the_user_chose(chosen, expected):
    """bm25s runs a JAX top-k when imported; on a GPU machine with JAX that first use took 75% of the GPU in every
    process importing bm25s, and the policy ran out of memory (seen on an H100). There is no GPU or JAX here, so
    this checks what reaches JAX: JAX_PLATFORMS is cpu after the retriever loads bm25s, and a user's choice (here
    the empty one, JAX's own default, valid with or without a GPU) stays."""
    env = {key: value for key, value in os.environ.items() if key != "JAX_PLATFORMS"}
    if chosen is not None:
        env["JAX_PLATFORMS"] = chosen
    script = (
        "import os\n"
        "from r3_env.data import Passage\n"
        "from r3_env.retrieval.bm25 import BM25Retriever\n"
        "retriever = BM25Retriever.from_passages([Passage.from_title_text('1', 'Oslo', 'Oslo is a city.')])\n"
        "assert retriever.search(['Oslo'], 1)[0][0].passage.id == '1'\n"
        "print(os.environ.get('JAX_PLATFORMS'))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == expected


def test_bm25_rankings_equal_flashrag_bm25_retriever(built):
    """FlashRAG's own BM25Retriever (flashrag-dev) loads our index and ranks every query identically."""
    from flashrag.retriever.retriever import BM25Retriever as FlashRAGBM25

    flashrag = FlashRAGBM25(
        {
            "retrieval_method": "bm25",
            "retrieval_topk": 5,
            "index_path": str(built["bm25"]),
            "corpus_path": str(built["corpus"]),
            "save_retrieval_cache": False,
            "use_retrieval_cache": False,
            "retrieval_cache_path": None,
            "use_reranker": False,
            "bm25_backend": "bm25s",
        }
    )
    docs, scores = flashrag.batch_search(built["questions"], num=5, return_score=True)
    with load_retriever(bm25_config(built)) as ours:
        hits = ours.search(built["questions"], 5)
    assert ids(hits) == [[d["id"] for d in row] for row in docs]
    assert np.allclose([[h.score for h in row] for row in hits], np.asarray(scores, dtype=float), atol=1e-5)


def test_flashrag_0_1_2_character_index_is_refused_with_the_fix(built, tmp_path):
    folder = tmp_path / "fr" / "bm25"
    folder.mkdir(parents=True)
    for name in ("params.index.json", "data.csc.index.npy", "indices.csc.index.npy", "indptr.csc.index.npy"):
        (folder / name).write_bytes((built["bm25"] / name).read_bytes())
    (folder / "vocab.index.json").write_text(json.dumps({c: i for i, c in enumerate("abcdefgh ")}))
    with pytest.raises(IndexFormatError, match="single characters.*r3rag index build"):
        BM25Retriever.load(folder, built["corpus"])


def test_dense_index_layout_and_search(built):
    idx = built["root"] / "idx"
    assert built["dense"] == idx / "minilm_Flat.index"
    assert (idx / "emb_minilm.memmap").stat().st_size == 400 * 384 * 4
    meta = json.loads((idx / "minilm_Flat.index.json").read_text())
    assert meta["count"] == 400 and meta["dim"] == 384
    passages = list(iter_corpus(built["corpus"]))
    with load_retriever(dense_config(built)) as retriever:
        hits = retriever.search([p.contents for p in passages[:20]], 2)
    assert [row[0].passage.id for row in hits] == [p.id for p in passages[:20]]  # a passage finds itself
    assert all(0.99 < row[0].score <= 1.0001 for row in hits)


def test_rebuilding_with_another_faiss_type_reuses_the_embeddings(built, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the corpus was encoded again")

    monkeypatch.setattr(Encoder, "encode", refuse)
    ivf = build_dense_index(
        built["corpus"],
        built["root"] / "idx",
        "minilm",
        minilm_path(),
        faiss_type="IVF8,Flat",
        sentence_transformer=True,
    )
    assert ivf.name == "minilm_IVF8,Flat.index"
    monkeypatch.undo()
    config = dense_config(built, faiss_nprobe=8)
    flat = load_retriever(config)
    ivf_retriever = load_retriever(RetrieverConfig(**{**config.__dict__, "index_path": str(ivf)}))
    queries = built["questions"][:10]
    assert ids(ivf_retriever.search(queries, 5)) == ids(flat.search(queries, 5))  # nprobe = nlist: exact


def test_a_killed_encode_resumes_where_it_stopped(built, tmp_path):
    encoder = Encoder(minilm_path(), sentence_transformer=True)
    spec = EncodingSpec("minilm", minilm_path(), "mean", 256, "", True, {"corpus": "test"})
    calls = {"n": 0}
    real_encode = encoder.encode

    def dying_encode(texts, batch_size=128):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real_encode(texts, batch_size)

    encoder.encode = dying_encode
    with pytest.raises(KeyboardInterrupt):
        encode_corpus(built["corpus"], tmp_path, "minilm", encoder, spec, batch_size=32, chunk=100)
    progress = json.loads(embedding_file(tmp_path, "minilm").with_suffix(".progress.json").read_text())
    assert progress["rows_done"] == 200
    encoded: list[int] = []

    def counting_encode(texts, batch_size=128):
        encoded.append(len(texts))
        return real_encode(texts, batch_size)

    encoder.encode = counting_encode
    resumed = np.array(encode_corpus(built["corpus"], tmp_path, "minilm", encoder, spec, batch_size=32, chunk=100))
    assert encoded == [100, 100], "the resumed run encodes only the rows the killed one had not finished"
    reference = np.memmap(built["root"] / "idx" / "emb_minilm.memmap", dtype=np.float32, mode="r", shape=(400, 384))
    assert np.allclose(resumed, reference, atol=1e-5)


def test_hf_pooling_matches_sentence_transformers_and_instructions_follow_the_model_family():
    texts = ["Who directed Silent Harbor?", "Marta Kell is a Valdorian film director."]
    hf = Encoder(minilm_path(), pooling_method="mean").encode(texts)
    st = Encoder(minilm_path(), sentence_transformer=True).encode(texts)
    assert np.allclose(hf, st, atol=1e-4)
    assert np.allclose(np.linalg.norm(hf, axis=1), 1.0, atol=1e-5)
    assert default_instructions("e5") == ("query: ", "passage: ")
    assert default_instructions("bge-large-en-v1.5")[0].startswith("Represent this sentence")
    assert default_instructions("minilm") == ("", "")
    assert (
        RetrieverConfig(
            retrieval_method="e5", index_path="x", corpus_path="c", retrieval_model_path="m", instruction=""
        ).query_instruction()
        == ""
    )


def test_hybrid_fuses_both_rankings(built):
    a = [Hit(Passage(str(i), f"t{i}\nx"), 1.0) for i in (1, 2, 3)]
    b = [Hit(Passage(str(i), f"t{i}\nx"), 1.0) for i in (3, 4, 1)]
    fused = reciprocal_rank_fusion([a, b], k=4, rrf_k=60)
    assert [h.passage.id for h in fused] == ["1", "3", "2", "4"]
    assert fused[0].score == pytest.approx(1 / 61 + 1 / 63)
    config = RetrieverConfig(
        retrieval_method="hybrid",
        dense_method="minilm",
        index_path=str(built["dense"]),
        bm25_index_path=str(built["bm25"]),
        corpus_path=str(built["corpus"]),
        retrieval_model_path=minilm_path(),
        use_sentence_transformer=True,
    )
    queries = built["questions"][:5]
    with (
        load_retriever(config) as hybrid,
        load_retriever(bm25_config(built)) as sparse,
        load_retriever(dense_config(built)) as dense,
    ):
        rows = hybrid.search(queries, 5)
        deep_sparse, deep_dense = sparse.search(queries, 50), dense.search(queries, 50)
    expected = [reciprocal_rank_fusion([a, b], 5) for a, b in zip(deep_sparse, deep_dense, strict=True)]
    assert ids(rows) == ids(expected)
    assert any(set(ids([row])[0]) - set(ids([top[:5]])[0]) for row, top in zip(rows, deep_sparse, strict=True)), (
        "the fusion brings in passages BM25 alone does not rank in its top 5"
    )


def test_config_and_loading_errors_name_the_fix(built, tmp_path):
    with pytest.raises(ValueError, match="index_path is required"):
        RetrieverConfig()
    with pytest.raises(ValueError, match="retrieval_model_path is required"):
        RetrieverConfig(retrieval_method="e5", index_path="x", corpus_path="c")
    with pytest.raises(IndexFormatError, match="not a bm25s index folder"):
        load_retriever(RetrieverConfig(index_path=str(tmp_path)))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_retriever(
            dense_config(built, faiss_gpu=False).__class__(
                **{**dense_config(built).__dict__, "index_path": str(tmp_path / "missing.index")}
            )
        )
    other = tmp_path / "other.jsonl"
    other.write_text('{"id": "1", "contents": "a\\nb"}\n')
    with pytest.raises(IndexFormatError, match="holds 400 .* has 1 rows"):
        BM25Retriever.load(built["bm25"], other)
    with pytest.raises(RuntimeError, match="pyserini"):
        load_retriever(bm25_config(built, bm25_backend="pyserini"))


def test_docstore_caches_offsets_and_notices_a_changed_corpus(tmp_path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"id": str(i), "contents": f"t{i}\nx"}) + "\n" for i in range(5)))
    store = DocStore(corpus)
    assert [store.row(i).id for i in range(5)] == ["0", "1", "2", "3", "4"] and len(store) == 5
    assert (tmp_path / "c.jsonl.offsets.npy").exists()
    with pytest.raises(IndexError, match="out of range"):
        store.row(5)
    corpus.write_text(json.dumps({"id": "z", "contents": "z\nz"}) + "\n")
    assert DocStore(corpus).row(0).id == "z"


# -- the service on a real port ----------------------------------------------------------------------


def write_config(path: Path, retriever: RetrieverConfig, **service) -> Path:
    values = {k: v for k, v in retriever.__dict__.items() if v not in ("", None)}
    values["service"] = service
    path.write_text(yaml.safe_dump(values))
    return path


@pytest.fixture(scope="module")
def bm25_service(built):
    config = write_config(
        built["root"] / "bm25.yaml",
        bm25_config(built),
        max_queries_per_request=300,
        max_query_chars=5000,
        max_topk=50,
        max_body_bytes=2_000_000,
        batch_window_ms=20,
    )
    with ServiceProcess(["retriever", "serve", "--config", str(config)]) as service:
        yield service


def post(service, path: str, body, **kwargs) -> httpx.Response:
    return httpx.post(service.url + path, json=body, timeout=30, **kwargs)


def test_batched_and_single_endpoints_equal_the_in_process_retriever(built, bm25_service):
    queries = built["questions"][:12]
    with load_retriever(bm25_config(built)) as local:
        expected = local.search(queries, 4)
    scored = post(bm25_service, "/retrieve", {"queries": queries, "topk": 4, "return_scores": True}).json()
    assert [[item["document"]["id"] for item in row] for row in scored["result"]] == ids(expected)
    assert np.allclose(
        [[i["score"] for i in row] for row in scored["result"]], [[h.score for h in r] for r in expected]
    )
    plain = post(bm25_service, "/retrieve", {"queries": queries, "topk": 4}).json()
    assert [[doc["id"] for doc in row] for row in plain["result"]] == ids(expected)
    assert set(plain["result"][0][0]) == {"id", "contents"}
    single = post(bm25_service, "/search", {"query": queries[0]}).json()
    assert [doc["id"] for doc in single] == ids(local_search(built, queries[:1], 5))[0]
    health = httpx.get(bm25_service.url + "/health").json()
    assert health["status"] == "ok" and health["documents"] == 400


def local_search(built, queries, k):
    with load_retriever(bm25_config(built)) as local:
        return local.search(queries, k)


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"queries": [], "topk": 3}, 422, "queries is empty"),
        ({"queries": ["x" * 100_000], "topk": 3}, 422, "over max_query_chars=5000"),
        ({"queries": ["who"], "topk": 0}, 422, "between 1 and max_topk=50"),
        ({"queries": ["who"], "topk": 10_000}, 422, "between 1 and max_topk=50"),
        ({"queries": ["who"] * 301}, 422, "exceed max_queries_per_request=300"),
        ({"queries": ["   "]}, 422, "queries[0] is empty"),
        ({"queries": "who"}, 422, "queries"),
        ({"query": 3}, 422, "queries"),
    ],
)
def test_bad_requests_get_a_4xx_that_names_the_limit(bm25_service, body, status, message):
    response = post(bm25_service, "/retrieve", body)
    assert response.status_code == status and message in response.text
    assert post(bm25_service, "/retrieve", {"queries": ["who directed"]}).status_code == 200


def test_malformed_json_and_oversized_bodies(bm25_service):
    response = httpx.post(
        bm25_service.url + "/retrieve",
        content=b'{"queries": [',
        timeout=10,
        headers={"content-type": "application/json"},
    )
    assert response.status_code == 422 and "JSON" in response.text
    huge = post(bm25_service, "/retrieve", {"queries": ["y" * 4000] * 600})
    assert huge.status_code == 413 and "max_body_bytes=2000000" in huge.text
    assert httpx.get(bm25_service.url + "/health").status_code == 200


def test_two_hundred_concurrent_requests_are_coalesced_without_error(built, bm25_service):
    queries = [f"{q} {i}" for i, q in enumerate(built["questions"] * 5)][:200]

    async def run() -> list[list[list[Hit]]]:
        client = AsyncRetrievalClient(bm25_service.url, retries=0)
        try:
            return await asyncio.gather(*(client.search([q], 3) for q in queries))
        finally:
            await client.aclose()

    results = asyncio.run(run())
    assert all(len(r) == 1 and len(r[0]) == 3 for r in results)
    metrics = httpx.get(bm25_service.url + "/metrics").text
    batches = float(
        next(
            line.split()[-1] for line in metrics.splitlines() if line.startswith("r3rag_retrieval_batch_queries_count")
        )
    )
    assert batches <= 100, f"concurrent queries were not batched together ({batches:.0f} batches for 200)"
    assert 'r3rag_retrieval_requests_total{endpoint="/retrieve",status="200"}' in metrics


def test_repeated_queries_are_served_from_the_cache(bm25_service):
    def hits() -> float:
        text = httpx.get(bm25_service.url + "/metrics").text
        return float(
            next(line.split()[-1] for line in text.splitlines() if line.startswith("r3rag_retrieval_cache_hits_total"))
        )

    before = hits()
    for _ in range(3):
        post(bm25_service, "/retrieve", {"queries": ["cache me please"], "topk": 2})
    assert hits() - before == 2


def test_missing_index_is_a_clear_startup_error(tmp_path):
    result = run_r3rag("retriever", "serve", "--index_path", str(tmp_path / "nope"), "--service.port", str(free_port()))
    assert result.returncode == 2 and "not a bm25s index folder" in result.stderr and "Traceback" not in result.stderr


def test_auth_is_required_when_a_key_is_set(built):
    config = write_config(built["root"] / "auth.yaml", bm25_config(built), api_key="s3cret")
    with ServiceProcess(["retriever", "serve", "--config", str(config)]) as service:
        assert post(service, "/retrieve", {"queries": ["who"]}).status_code == 401
        wrong = post(service, "/retrieve", {"queries": ["who"]}, headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
        assert httpx.get(service.url + "/health").status_code == 200
        with pytest.raises(RetrievalServiceError, match="401"):
            RetrievalClient(service.url, retries=0).search(["who"], 1)
        assert len(RetrievalClient(service.url, api_key="s3cret").search(["who", "what"], 2)) == 2


def test_client_retries_through_a_restart_and_reports_an_unreachable_service(built):
    port = free_port()
    config = write_config(built["root"] / "restart.yaml", bm25_config(built))
    args = ["retriever", "serve", "--config", str(config)]
    first = ServiceProcess(args, port=port).start()
    client = RetrievalClient(first.url, retries=8, backoff=0.25)
    before = client.search(["who directed"], 3)
    first.stop()
    second = ServiceProcess(args, port=port)
    restarter = threading.Timer(1.0, second.start)
    restarter.start()
    try:
        started = time.time()
        after = client.search(["who directed"], 3)  # retried until the restarted service answered
        assert ids(after) == ids(before) and time.time() - started > 0.5
    finally:
        restarter.join()
        second.stop()
    with pytest.raises(RetrievalServiceError, match=r"did not answer after 2 attempts.*r3rag retriever serve"):
        RetrievalClient(f"http://127.0.0.1:{free_port()}", retries=1, backoff=0.05).search(["x"], 1)


def test_in_process_mode_and_client_answer_the_same(built, bm25_service):
    with open_retriever(config=bm25_config(built)) as local, open_retriever(bm25_service.url) as remote:
        queries = built["questions"][:30]
        assert ids(local.search(queries, 5)) == ids(remote.search(queries, 5))
        assert remote.health()["retrieval_method"] == "bm25"
    with pytest.raises(ValueError, match="give a retrieval service url"):
        open_retriever()


def test_dense_service_matches_in_process(built):
    config = write_config(built["root"] / "dense.yaml", dense_config(built))
    with ServiceProcess(["retriever", "serve", "--config", str(config)]) as service:
        with RetrievalClient(service.url) as client, load_retriever(dense_config(built)) as local:
            queries = built["questions"][:8]
            remote, here = client.search(queries, 5), local.search(queries, 5)
    assert ids(remote) == ids(here)
    assert np.allclose([[h.score for h in r] for r in remote], [[h.score for h in r] for r in here], atol=1e-5)


def test_cli_index_build_errors(tmp_path):
    result = run_r3rag("index", "build", "--corpus_path", str(tmp_path / "none.jsonl"))
    assert result.returncode == 2 and "corpus_path" in result.stderr and "does not exist" in result.stderr
    result = run_r3rag("index", "build", "--retrieval_method", "e5", "--corpus_path", __file__)
    assert result.returncode == 2 and "model_path is required" in result.stderr


def test_flashrag_built_dense_index_serves(built, tmp_path, monkeypatch):
    """FlashRAG's own Index_Builder writes the faiss file (from our embeddings); our retriever serves it.

    flashrag-dev's builder moves its encoder to CUDA unconditionally; ``Module.cuda`` is made a no-op
    here (a test double for the GPU this machine lacks). With ``embedding_path`` it encodes nothing.
    """
    import torch
    from flashrag.retriever.index_builder import Index_Builder

    monkeypatch.setattr(torch.nn.Module, "cuda", lambda self, *a, **k: self)
    builder = Index_Builder(
        retrieval_method="minilm",
        model_path=minilm_path(),
        corpus_path=str(built["corpus"]),
        save_dir=str(tmp_path),
        max_length=256,
        batch_size=32,
        use_fp16=False,
        pooling_method="mean",
        instruction=" ",
        faiss_type="Flat",
        embedding_path=str(built["root"] / "idx" / "emb_minilm.memmap"),
    )
    builder.build_index()
    flashrag_index = tmp_path / "minilm_Flat.index"
    assert flashrag_index.exists() and not (tmp_path / "minilm_Flat.index.json").exists()
    ours = dense_config(built)
    theirs = RetrieverConfig(**{**ours.__dict__, "index_path": str(flashrag_index)})
    queries = built["questions"][:10]
    with load_retriever(ours) as a, load_retriever(theirs) as b:
        assert ids(a.search(queries, 5)) == ids(b.search(queries, 5))


def test_launch_script_resolves_a_command_the_cli_accepts():
    from conftest import ROOT

    from r3_env.cli import build_parser

    env = {**os.environ, "CONFIG": "r.yaml", "FAISS_GPU": "false", "PORT": "9001", "R3RAG_RETRIEVER_API_KEY": "k"}
    result = subprocess.run(
        ["bash", "launch/serve_retriever.sh", "--dry-run", "--retrieval_topk", "3"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    command = result.stdout.split()
    assert command == [
        "r3rag",
        "retriever",
        "serve",
        "--config",
        "r.yaml",
        "--service.port",
        "9001",
        "--no-faiss_gpu",
        "--retrieval_topk",
        "3",
    ]
    args = build_parser().parse_args(command[1:])
    assert (args.config, args.faiss_gpu, getattr(args, "service.port"), args.retrieval_topk) == (
        "r.yaml",
        False,
        9001,
        3,
    )
    assert "warning" not in result.stderr


def test_service_reads_its_key_from_the_environment(built, monkeypatch):
    from r3_env.cli import build_parser
    from r3_env.retrieval.cli import load_serve_configs

    monkeypatch.setenv("R3RAG_RETRIEVER_API_KEY", "from-env")
    args = build_parser().parse_args(["retriever", "serve", "--index_path", str(built["bm25"])])
    assert load_serve_configs(args)[1].api_key == "from-env"
    assert RetrievalClient("http://127.0.0.1:1").headers == {"Authorization": "Bearer from-env"}


def test_build_bm25_without_a_corpus_copy_uses_corpus_path(built, tmp_path):
    folder = build_bm25_index(built["corpus"], tmp_path, save_corpus=False)
    assert not (folder / "corpus.jsonl").exists()
    with pytest.raises(FileNotFoundError, match="set corpus_path"):
        BM25Retriever.load(folder)
    with BM25Retriever.load(folder, built["corpus"]) as retriever:
        assert ids(retriever.search(built["questions"][:5], 3)) == ids(local_search(built, built["questions"][:5], 3))


# -- the service's own logic, around a retriever the test controls --------------------------------------


class ScriptedRetriever:
    """A real in-process retriever wrapped to misbehave on purpose: raise, or return too few results."""

    def __init__(self, inner) -> None:
        self.inner, self.calls, self.fail_next = inner, [], []

    def search(self, queries, k):
        self.calls.append(list(queries))
        if self.fail_next:
            mode = self.fail_next.pop(0)
            if mode == "raise":
                raise RuntimeError("index shard unavailable")
            return self.inner.search(queries, k)[:-1]
        return self.inner.search(queries, k)

    def close(self):
        self.inner.close()


@pytest.fixture()
def scripted(built):
    from conftest import InThreadServer

    from r3_env.retrieval.service import ServiceConfig, create_app

    retriever = ScriptedRetriever(load_retriever(bm25_config(built)))
    app = create_app(retriever, 3, ServiceConfig(batch_window_ms=50, cache_size=2, max_body_bytes=5000))
    with InThreadServer(app) as server:
        yield server, retriever


def test_a_failing_batch_fails_only_its_requests(scripted):
    server, retriever = scripted
    for mode in ("raise", "short"):
        retriever.fail_next = [mode]
        response = httpx.post(server.url + "/retrieve", json={"queries": [f"failing {mode}", f"also {mode}"]})
        assert response.status_code == 500 and "the retriever failed" in response.text
        ok = httpx.post(server.url + "/retrieve", json={"queries": [f"after {mode}"]})
        assert ok.status_code == 200 and len(ok.json()["result"][0]) == 3


def test_client_reports_a_failing_service_and_recovers_from_a_flaky_one(scripted):
    server, retriever = scripted
    retriever.fail_next = ["raise", "raise"]
    with pytest.raises(
        RetrievalServiceError, match="kept failing after 2 attempts: HTTP 500: the retriever failed"
    ) as e:
        RetrievalClient(server.url, retries=1, backoff=0.01).search(["flaky one"], 2)
    assert e.value.status == 500
    retriever.fail_next = ["raise"]
    assert len(RetrievalClient(server.url, retries=2, backoff=0.01).search(["flaky two"], 2)[0]) == 2


def test_lru_eviction_and_deduplication_across_requests(scripted):
    server, retriever = scripted
    for query in ("alpha film", "beta film", "gamma film", "alpha film"):  # cache_size 2: alpha was evicted
        httpx.post(server.url + "/retrieve", json={"queries": [query]})
    assert [q for call in retriever.calls for q in call].count("alpha film") == 2
    retriever.calls.clear()

    async def twice() -> None:
        async with httpx.AsyncClient() as client:
            await asyncio.gather(
                *(client.post(server.url + "/retrieve", json={"queries": ["delta film"]}) for _ in range(2))
            )

    asyncio.run(twice())
    assert retriever.calls == [["delta film"]], "two requests in flight for one query cost one search"


def test_chunked_bodies_over_the_limit_and_stray_paths(scripted):
    server, _ = scripted

    def chunks():
        for _ in range(10):
            yield b" " * 1000

    response = httpx.post(server.url + "/retrieve", content=chunks(), headers={"content-type": "application/json"})
    assert response.status_code == 413 and "max_body_bytes=5000" in response.text
    for path in ("/x1", "/x2", "/x3"):
        assert httpx.get(server.url + path).status_code == 404
    metrics = httpx.get(server.url + "/metrics").text
    assert 'endpoint="other",status="404"} 3.0' in metrics and "/x1" not in metrics


def test_official_r3rag_retriever_config_loads(built, tmp_path):
    from r3_env.cli import build_parser
    from r3_env.retrieval.cli import load_serve_configs

    official = {
        "retrieval_method": "e5",
        "retrieval_model_path": "intfloat/e5-base-v2",
        "retrieval_query_max_length": 256,
        "retrieval_use_fp16": True,
        "retrieval_topk": 5,
        "retrieval_batch_size": 32,
        "index_path": "index/e5_Flat.index",
        "corpus_path": "corpus.jsonl",
        "save_retrieval_cache": False,
        "use_retrieval_cache": False,
        "retrieval_cache_path": None,
        "use_reranker": False,
        "faiss_gpu": True,
        "use_sentence_transformer": False,
        "retrieval_pooling_method": "mean",
        "instruction": None,
    }
    path = tmp_path / "official.yaml"
    path.write_text(yaml.safe_dump(official))
    retriever, *_ = load_serve_configs(build_parser().parse_args(["retriever", "serve", "--config", str(path)]))
    assert (retriever.retrieval_method, retriever.faiss_gpu, retriever.retrieval_batch_size) == ("e5", True, 32)
    too_big = build_parser().parse_args(["retriever", "serve", "--index_path", "x", "--retrieval_topk", "300"])
    with pytest.raises(ValueError, match="retrieval_topk=300 exceeds service.max_topk=200"):
        load_serve_configs(too_big)
