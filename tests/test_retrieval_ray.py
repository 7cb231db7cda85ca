"""Retrieval on a local Ray cluster (CPU): Serve replicas, losing one, and sharded faiss indexes.

The tests that start Ray are slow (`pytest -m slow`); sharding itself and the launch script are in the default
suite.

Everything is real: Ray, Ray Serve's proxy and router, the replicas' apps, bm25s and faiss
indexes built by ``r3rag index build`` and split by ``r3rag index shard``.
"""

from __future__ import annotations

import json
import os
import subprocess
import time

import faiss
import httpx
import numpy as np
import pytest
from conftest import InThreadServer, ServiceProcess, free_port, minilm_path, run_r3rag

from r3_env.retrieval import RetrieverConfig, load_retriever
from r3_env.retrieval.client import RetrievalClient
from r3_env.retrieval.index_builder import IndexBuildConfig, build_index
from r3_env.retrieval.ray_serve import APP_NAME, RayServeConfig, deploy
from r3_env.retrieval.service import ServiceConfig, create_app
from r3_env.retrieval.shards import NAMESPACE, merge_topk, shard_index
from r3_env.world import WorldConfig, generate_world

ray = pytest.importorskip("ray")
serve = pytest.importorskip("ray.serve")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A 300-entity world with a BM25 index, and MiniLM Flat and IVF indexes."""
    root = tmp_path_factory.mktemp("ray_retrieval")
    generate_world(WorldConfig(entities=300, seed=2, bm25_check=0), root / "world")
    corpus = root / "world" / "corpus.jsonl"
    bm25 = build_index(IndexBuildConfig(corpus_path=str(corpus), save_dir=str(root / "idx")))
    dense = {}
    for faiss_type in ("Flat", "IVF8,Flat"):
        dense[faiss_type] = build_index(
            IndexBuildConfig(
                retrieval_method="minilm",
                corpus_path=str(corpus),
                save_dir=str(root / "idx"),
                model_path=minilm_path(),
                sentence_transformer=True,
                faiss_type=faiss_type,
                batch_size=64,
            )
        )
    questions = [json.loads(line)["question"] for line in (root / "world" / "dev.jsonl").read_text().splitlines()]
    return {"root": root, "corpus": corpus, "bm25": bm25, "dense": dense, "questions": questions[:30]}


@pytest.mark.slow  # first: it starts a Ray cluster of its own, before this module's (slow tests too)
def test_cli_serves_on_its_own_ray_cluster_and_stops_on_sigterm(built):
    args = ["retriever", "serve", "--ray", "--index_path", str(built["bm25"]), "--ray.replicas", "1"]
    with ServiceProcess(args, timeout=240) as service:
        answer = retrieve(service.url, built["questions"][:2])
        assert len(answer["result"]) == 2 and len(answer["result"][0]) == 5
    assert service.process.returncode == 0, service.log_path.read_text()[-2000:]


def dense_config(built, index_path, **extra) -> RetrieverConfig:
    return RetrieverConfig(
        retrieval_method="minilm",
        index_path=str(index_path),
        corpus_path=str(built["corpus"]),
        retrieval_model_path=minilm_path(),
        use_sentence_transformer=True,
        faiss_nprobe=3,
        shard_num_cpus=0.25,
        **extra,
    )


@pytest.fixture(scope="module")
def cluster():
    # address local: a cluster of its own, never one a stale /tmp/ray/ray_current_cluster names
    ray.init(address="local", num_cpus=2, include_dashboard=False, namespace=NAMESPACE, log_to_driver=False)
    yield
    serve.shutdown()
    ray.shutdown()


@pytest.fixture(scope="module")
def replicas(built, cluster):
    """Two Serve replicas of the BM25 service on a free port."""
    config = RetrieverConfig(index_path=str(built["bm25"]))
    service = ServiceConfig(port=free_port(), cache_size=0)
    deploy(config, service, RayServeConfig(replicas=2, replica_num_cpus=0.25))
    yield {"url": f"http://127.0.0.1:{service.port}", "config": config, "service": service}
    serve.delete(APP_NAME)


def retrieve(url: str, queries: list[str], k: int = 5) -> dict:
    response = httpx.post(url + "/retrieve", json={"queries": queries, "topk": k, "return_scores": True}, timeout=60)
    response.raise_for_status()
    return response.json()


@pytest.mark.slow
def test_serve_replicas_answer_like_the_plain_service(built, replicas):
    questions = built["questions"]
    retriever = load_retriever(replicas["config"])
    plain = create_app(retriever, replicas["config"].retrieval_topk, replicas["service"], {})
    with InThreadServer(plain) as server:
        expected = retrieve(server.url, questions)
        expected_single = httpx.post(server.url + "/search", json={"query": questions[0]}).json()
    assert retrieve(replicas["url"], questions) == expected
    assert httpx.post(replicas["url"] + "/search", json={"query": questions[0]}).json() == expected_single
    health = httpx.get(replicas["url"] + "/health").json()
    assert health["retrieval_method"] == "bm25" and health["documents"] == len(retriever)
    # Many clients at once: every answer is the plain service's, whichever replica and batch served it.
    with RetrievalClient(replicas["url"]) as client:
        import concurrent.futures

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda q: client.search([q], 5), questions))
    expected_ids = [[hit["document"]["id"] for hit in hits] for hits in expected["result"]]
    assert [[hit.passage.id for hit in hits] for [hits] in answers] == expected_ids
    assert httpx.post(replicas["url"] + "/retrieve", json={"queries": []}).status_code == 422


def replica_actors() -> list[str]:
    prefix = f"SERVE_REPLICA::{APP_NAME}#"
    return [a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].startswith(prefix)]


@pytest.mark.slow
def test_requests_keep_succeeding_when_a_replica_dies(built, replicas):
    questions = built["questions"]
    expected = retrieve(replicas["url"], questions[:3])
    [victim, survivor] = sorted(replica_actors())
    ray.kill(ray.get_actor(victim, namespace="serve"), no_restart=True)
    with RetrievalClient(replicas["url"]) as client:
        for _ in range(20):
            hits = client.search(questions[:3], 5)
            assert [[hit.passage.id for hit in row] for row in hits] == [
                [hit["document"]["id"] for hit in row] for row in expected["result"]
            ]
    deadline = time.time() + 120  # Serve replaces the lost replica
    while time.time() < deadline:
        names = replica_actors()
        if len(names) == 2 and victim not in names and survivor in names:
            status = serve.status().applications[APP_NAME].deployments["retriever"]
            if status.replica_states.get("RUNNING") == 2:
                break
        time.sleep(0.5)
    else:
        raise AssertionError(f"Serve did not replace the killed replica: {replica_actors()}")
    assert retrieve(replicas["url"], questions[:3]) == expected


@pytest.mark.slow
@pytest.mark.parametrize("faiss_type", ["Flat", "IVF8,Flat"])
def test_sharded_dense_retrieval_equals_unsharded(built, cluster, faiss_type):
    index_path = built["dense"][faiss_type]
    manifest = shard_index(index_path, 3)
    spec = json.loads(manifest.read_text())
    assert [entry["rows"] for entry in spec["shards"]][0][0] == 0 and spec["shards"][-1]["rows"][1] == spec["count"]
    whole = load_retriever(dense_config(built, index_path))
    sharded = load_retriever(dense_config(built, manifest))
    assert len(sharded.index.actors) == 3
    for k in (1, 7):
        expected = whole.search(built["questions"], k)
        answers = sharded.search(built["questions"], k)
        assert [[h.passage.id for h in row] for row in answers] == [[h.passage.id for h in row] for row in expected]
        scores = np.array([[h.score for h in row] for row in answers])
        assert np.allclose(scores, [[h.score for h in row] for row in expected], atol=1e-5)
    sharded.close()
    assert not [a for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].startswith("shard-")]
    whole.close()


def test_merge_orders_by_score_then_row_and_drops_missing_rows():
    first = (np.array([[0.9, 0.5, 0.1]]), np.array([[4, 2, -1]]))
    second = (np.array([[0.9, 0.7, 0.2]]), np.array([[1, 8, 9]]))
    scores, rows = merge_topk([first, second], 4, higher_is_better=True)
    assert rows.tolist() == [[1, 4, 8, 2]] and scores.tolist() == [[0.9, 0.9, 0.7, 0.5]]
    scores, rows = merge_topk([first, second], 2, higher_is_better=False)  # L2: smaller is nearer
    assert rows.tolist() == [[9, 2]]


def test_shard_command_splits_and_refuses_what_it_cannot_split(built, tmp_path):
    result = run_r3rag("index", "shard", "--index_path", str(built["dense"]["Flat"]), "--shards", "2")
    assert result.returncode == 0 and "index_path=" in result.stdout
    vectors = np.random.default_rng(0).standard_normal((50, 8)).astype("float32")
    hnsw = faiss.IndexHNSWFlat(8, 8, faiss.METRIC_INNER_PRODUCT)
    hnsw.add(vectors)
    faiss.write_index(hnsw, str(tmp_path / "hnsw.index"))
    result = run_r3rag("index", "shard", "--index_path", str(tmp_path / "hnsw.index"), "--shards", "2")
    assert result.returncode != 0 and "cannot be split row by row" in result.stderr
    result = run_r3rag("index", "shard", "--index_path", str(tmp_path / "missing.index"))
    assert result.returncode != 0 and "does not exist" in result.stderr
    result = run_r3rag("index", "shard", "--index_path", str(built["dense"]["Flat"]), "--shards", "1")
    assert result.returncode != 0 and "shards must be at least 2" in result.stderr


def test_a_manifest_naming_a_lost_shard_is_refused(built, tmp_path):
    manifest = tmp_path / "lost.index.shards.json"
    manifest.write_text(json.dumps({"dim": 384, "count": 1, "shards": [{"path": "gone.index", "offset": 0}]}))
    with pytest.raises(FileNotFoundError, match="gone.index, which is missing"):
        load_retriever(dense_config(built, manifest))


@pytest.mark.slow
def test_serve_replicas_share_one_set_of_shards(built, replicas):
    """Redeploys the app over a sharded dense index (a cluster's Serve proxy keeps its first port)."""
    manifest = shard_index(built["dense"]["Flat"], 2)
    config = dense_config(built, manifest)
    service = replicas["service"]
    shards = deploy(config, service, RayServeConfig(replicas=2, replica_num_cpus=0.25))
    try:
        shard_actors = [a for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].startswith("shard-")]
        assert len(shard_actors) == 2  # the replicas attached to the deployer's shards, not their own
        whole = load_retriever(dense_config(built, built["dense"]["Flat"]))
        expected = whole.search(built["questions"], 4)
        answer = retrieve(f"http://127.0.0.1:{service.port}", built["questions"], 4)
        assert [[hit["document"]["id"] for hit in row] for row in answer["result"]] == [
            [h.passage.id for h in row] for row in expected
        ]
        whole.close()
    finally:
        shards.close()


@pytest.mark.parametrize(("replicas", "expected"), [("3", ["--ray", "--ray.replicas", "3"]), ("", [])])
def test_launch_script_serves_replicas_through_ray_serve(replicas, expected):
    from conftest import ROOT

    from r3_env.cli import build_parser

    env = {**os.environ, "CONFIG": "r.yaml", "FAISS_GPU": "false", "REPLICAS": replicas}
    result = subprocess.run(
        ["bash", "launch/serve_retriever.sh", "--dry-run"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    command = result.stdout.split()
    assert command == ["r3rag", "retriever", "serve", "--config", "r.yaml", "--no-faiss_gpu", *expected]
    args = build_parser().parse_args(command[1:])
    assert args.ray == bool(replicas) and getattr(args, "ray.replicas") == (int(replicas) if replicas else None)


def test_launch_script_refuses_a_bad_replica_count():
    from conftest import ROOT

    env = {**os.environ, "CONFIG": "r.yaml", "REPLICAS": "two"}
    result = subprocess.run(
        ["bash", "launch/serve_retriever.sh", "--dry-run"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert result.returncode == 2 and "REPLICAS must be a whole number" in result.stderr
