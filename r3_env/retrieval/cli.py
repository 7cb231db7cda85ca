"""``r3rag index build`` and ``r3rag retriever serve``."""

from __future__ import annotations

import argparse
import dataclasses
import os
from pathlib import Path
from typing import Any

from r3_env.config import add_config_command, configs_from_args
from r3_env.retrieval.base import Retriever
from r3_env.retrieval.client import API_KEY_ENV
from r3_env.retrieval.config import FLASHRAG_IGNORED_KEYS, RetrieverConfig
from r3_env.retrieval.index_builder import IndexBuildConfig
from r3_env.retrieval.ray_serve import RayServeConfig
from r3_env.retrieval.service import ServiceConfig

SERVE_SECTIONS = [("", RetrieverConfig), ("service.", ServiceConfig), ("ray.", RayServeConfig)]


def add_index_parser(subparsers: argparse._SubParsersAction) -> None:
    actions = subparsers.add_parser("index", help="build retrieval indexes (BM25, dense faiss)").add_subparsers(
        dest="index_command", metavar="ACTION", required=True
    )
    add_config_command(
        actions,
        "build",
        [("", IndexBuildConfig)],
        run_build,
        help="build a FlashRAG-compatible index from a corpus .jsonl",
        description="Options follow `python -m flashrag.retriever.index_builder`. BM25 goes to SAVE_DIR/bm25/, a "
        "dense index to SAVE_DIR/{method}_{faiss_type}.index with its embeddings beside it.",
    )
    add_config_command(
        actions,
        "shard",
        [("", ShardConfig)],
        run_shard,
        help="split a Flat or IVF faiss index into shards that Ray actors hold",
        description="Writes INDEX.shard{i}of{S} and the manifest INDEX.shards.json; serve the manifest as "
        "index_path and each shard loads in its own Ray actor, its top-k merged exactly with the others'.",
    )


@dataclasses.dataclass(frozen=True)
class ShardConfig:
    """Which index to split, and into how many parts."""

    index_path: str = dataclasses.field(default="", metadata={"help": "the faiss index file to split"})
    shards: int = dataclasses.field(default=2, metadata={"help": "number of shards (one Ray actor each)"})

    def __post_init__(self) -> None:
        if not self.index_path:
            raise ValueError("index_path is required: the faiss index file to split")
        if self.shards < 2:
            raise ValueError(f"shards must be at least 2, got {self.shards}")


def run_shard(args: argparse.Namespace) -> int:
    from r3_env.retrieval.shards import shard_index

    [config] = configs_from_args(args, [("", ShardConfig)])
    print(f"shards written; serve them with index_path={shard_index(config.index_path, config.shards)}")
    return 0


def run_build(args: argparse.Namespace) -> int:
    from r3_env.retrieval.index_builder import build_index

    [config] = configs_from_args(args, [("", IndexBuildConfig)])
    print(f"index written to {build_index(config)}")
    return 0


def add_retriever_parser(subparsers: argparse._SubParsersAction) -> None:
    actions = subparsers.add_parser("retriever", help="serve a retriever over HTTP").add_subparsers(
        dest="retriever_command", metavar="ACTION", required=True
    )
    serve = add_config_command(
        actions,
        "serve",
        SERVE_SECTIONS,
        run_serve,
        help="start the batched retrieval service",
        description="Serves POST /retrieve (Search-R1), POST /search (R3-RAG), GET /health and GET /metrics. "
        "The YAML config holds FlashRAG's retriever keys at the top level, service keys under 'service:' and "
        "Ray Serve keys under 'ray:'.",
    )
    serve.add_argument(
        "--ray",
        action="store_true",
        help="deploy ray.replicas replicas on a Ray cluster with Ray Serve (batching by @serve.batch)",
    )


def load_serve_configs(args: argparse.Namespace) -> tuple[RetrieverConfig, ServiceConfig, RayServeConfig]:
    retriever, service, ray = configs_from_args(args, SERVE_SECTIONS, ignored=FLASHRAG_IGNORED_KEYS)
    if retriever.retrieval_topk > service.max_topk:
        raise ValueError(
            f"retrieval_topk={retriever.retrieval_topk} exceeds service.max_topk={service.max_topk}: "
            "every request without topk would be refused; lower one or raise the other"
        )
    if not service.api_key and os.environ.get(API_KEY_ENV):
        service = dataclasses.replace(service, api_key=os.environ[API_KEY_ENV])
    return retriever, service, ray


# What changes a service's results (its /health reports them; an eval run is known by them). Speed
# and placement settings (batch size, fp16, device, faiss_gpu) and the default top-k are left out.
RESULT_KEYS = (
    "retrieval_method",
    "index_path",
    "corpus_path",
    "retrieval_model_path",
    "retrieval_pooling_method",
    "retrieval_query_max_length",
    "instruction",
    "use_sentence_transformer",
    "faiss_nprobe",
    "bm25_backend",
    "bm25_index_path",
    "dense_method",
    "rrf_k",
    "hybrid_depth",
)
PATH_KEYS = ("index_path", "corpus_path", "bm25_index_path")


def describe_retriever(config: RetrieverConfig) -> dict[str, Any]:
    """The settings of ``config`` that change what it retrieves, local paths made absolute."""
    described = {key: getattr(config, key) for key in RESULT_KEYS}
    for key in PATH_KEYS:
        if described[key]:
            described[key] = str(Path(described[key]).resolve())
    model = described["retrieval_model_path"]
    if model and Path(model).exists():  # a local encoder folder; a hub name stays as given
        described["retrieval_model_path"] = str(Path(model).resolve())
    return described


def service_description(config: RetrieverConfig, retriever: Retriever) -> dict[str, Any]:
    """What /health reports: the settings that change results, and the index's size when known."""
    described = describe_retriever(config)
    if hasattr(retriever, "__len__"):
        described["documents"] = len(retriever)
    return described


def run_serve(args: argparse.Namespace) -> int:
    import logging

    from r3_env.retrieval import load_retriever
    from r3_env.retrieval.service import create_app
    from r3_env.serving import serve

    retriever_config, service_config, ray_config = load_serve_configs(args)
    if args.ray:
        from r3_env.retrieval.ray_serve import serve_on_ray

        serve_on_ray(retriever_config, service_config, ray_config)
        return 0
    retriever = load_retriever(retriever_config)  # a bad path or index fails here, before the port opens
    describe = service_description(retriever_config, retriever)
    app = create_app(retriever, retriever_config.retrieval_topk, service_config, describe)
    logging.getLogger(__name__).info(
        "serving %s on http://%s:%d", retriever_config.retrieval_method, service_config.host, service_config.port
    )
    serve(app, service_config.host, service_config.port)
    retriever.close()
    return 0
