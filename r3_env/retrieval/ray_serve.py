"""``r3rag retriever serve --ray``: the same retrieval app, replicated on a Ray cluster by Ray Serve.

Each replica loads the retriever and runs the app of :mod:`r3_env.retrieval.service` behind Serve's
HTTP proxy, which spreads requests over the replicas (Serve's power-of-two-choices router) and
stops sending to a replica that died while the controller starts its replacement. Inside a
replica, concurrent requests' queries are gathered by ``@serve.batch`` into one retriever call.

For an index larger than one machine's memory, serve a sharded index (``r3rag index shard``):
this process starts the shard actors once and owns them, and every replica searches through the
same actors, so replicas cost an encoder each, not an index each.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from r3_env.retrieval.base import Hit, Retriever
from r3_env.retrieval.config import RetrieverConfig
from r3_env.retrieval.service import HitCache, Metrics, ServiceConfig, create_app
from r3_env.retrieval.shards import NAMESPACE, ShardedIndex, is_manifest

logger = logging.getLogger(__name__)

APP_NAME = "r3rag-retriever"


@dataclass(frozen=True)
class RayServeConfig:
    """Where the replicas run and how each batches (only read with ``--ray``)."""

    address: str = field(
        default="",
        metadata={"help": "Ray cluster to join ('auto': the one on this node; empty: $RAY_ADDRESS, else a local one)"},
    )
    replicas: int = field(default=2, metadata={"help": "replicas of the app, each with its own retriever"})
    replica_num_cpus: float = field(default=1.0, metadata={"help": "CPUs each replica reserves"})
    replica_num_gpus: float = field(default=0.0, metadata={"help": "GPUs each replica reserves (dense encoder)"})
    max_ongoing_requests: int = field(default=64, metadata={"help": "requests a replica takes at once"})
    batch_wait_timeout_s: float = field(
        default=0.002, metadata={"help": "how long a replica's batch waits for more queries"}
    )

    def __post_init__(self) -> None:
        if self.replicas < 1 or self.max_ongoing_requests < 1:
            raise ValueError("ray.replicas and ray.max_ongoing_requests must be at least 1")
        if self.replica_num_cpus < 0 or self.replica_num_gpus < 0 or self.batch_wait_timeout_s < 0:
            raise ValueError("ray.replica_num_cpus, replica_num_gpus and batch_wait_timeout_s must be 0 or more")


class ServeSearcher:
    """The app's searcher in a Serve replica: the LRU cache, then ``@serve.batch`` over requests.

    One batched call takes a request's uncached queries (in pieces of at most
    ``service.max_batch_queries``); Serve gathers the calls that arrive together, up to that many
    queries or ``batch_wait_timeout_s``, and they are searched in one retriever call per k.
    """

    def __init__(self, retriever: Retriever, config: ServiceConfig, metrics: Metrics, wait_s: float) -> None:
        from ray import serve

        self.retriever, self.config, self.metrics = retriever, config, metrics
        self.cache = HitCache(config.cache_size)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="retriever")
        self._batched = serve.batch(
            max_batch_size=config.max_batch_queries,
            batch_wait_timeout_s=wait_s,
            batch_size_fn=lambda calls: sum(len(queries) for queries, _ in calls),
        )(self._search_calls)

    def start(self) -> None:
        """Nothing to start: Serve creates the batch queue on the first call."""

    async def stop(self) -> None:
        self._executor.shutdown(wait=True)

    async def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        found: dict[str, list[Hit]] = {}
        for query in dict.fromkeys(queries):
            cached = self.cache.get((query, k))
            if cached is not None:
                found[query] = cached
        self.metrics.cache_hits.inc(sum(query in found for query in queries))
        self.metrics.cache_misses.inc(sum(query not in found for query in queries))
        missing = [query for query in dict.fromkeys(queries) if query not in found]
        size = self.config.max_batch_queries
        pieces = [tuple(missing[start : start + size]) for start in range(0, len(missing), size)]
        for piece, results in zip(pieces, await asyncio.gather(*(self._batched((p, k)) for p in pieces)), strict=True):
            for query, hits in zip(piece, results, strict=True):
                self.cache.put((query, k), hits)
                found[query] = hits
        return [found[query] for query in queries]

    async def _search_calls(self, calls: list[tuple[tuple[str, ...], int]]) -> list[list[list[Hit]]]:
        by_k: dict[int, list[str]] = {}
        for queries, k in calls:
            by_k.setdefault(k, []).extend(queries)
        answers: dict[tuple[str, int], list[Hit]] = {}
        loop = asyncio.get_running_loop()
        for k, queries in by_k.items():
            unique = list(dict.fromkeys(queries))
            self.metrics.batch_size.observe(len(unique))
            results = await loop.run_in_executor(self._executor, self.retriever.search, unique, k)
            if len(results) != len(unique):
                raise RuntimeError(f"the retriever returned {len(results)} result lists for {len(unique)} queries")
            answers.update(((query, k), hits) for query, hits in zip(unique, results, strict=True))
        return [[answers[(query, k)] for query in queries] for queries, k in calls]


def app_builder(retriever_config: RetrieverConfig, service_config: ServiceConfig, wait_s: float) -> Callable:
    """The function each replica calls to build its app (it loads the retriever in the replica)."""

    def build():
        from r3_env.retrieval import load_retriever
        from r3_env.retrieval.cli import service_description

        retriever = load_retriever(retriever_config)
        return create_app(
            retriever,
            retriever_config.retrieval_topk,
            service_config,
            service_description(retriever_config, retriever),
            searcher_factory=lambda r, c, m: ServeSearcher(r, c, m, wait_s),
        )

    return build


def deploy(retriever_config: RetrieverConfig, service_config: ServiceConfig, ray_config: RayServeConfig):
    """Start Serve's proxy on the service's host and port and deploy the replicas; returns the shards owned here.

    Ray must be initialised. Returns once every replica answers (a replica that cannot load the
    retriever fails the deployment here, with its error).
    """
    from ray import serve

    shards = None
    if is_manifest(retriever_config.index_path):  # owned by this process, shared by every replica
        shards = ShardedIndex(
            retriever_config.index_path,
            retriever_config.faiss_nprobe,
            retriever_config.faiss_gpu,
            retriever_config.shard_num_cpus,
        )
    serve.start(http_options={"host": service_config.host, "port": service_config.port})
    deployment = serve.deployment(
        serve.ingress(app_builder(retriever_config, service_config, ray_config.batch_wait_timeout_s))(),
        name="retriever",
        num_replicas=ray_config.replicas,
        max_ongoing_requests=ray_config.max_ongoing_requests,
        ray_actor_options={"num_cpus": ray_config.replica_num_cpus, "num_gpus": ray_config.replica_num_gpus},
        logging_config={"enable_access_log": False},  # a log line per request costs more than a BM25 search
    )
    serve.run(deployment.bind(), name=APP_NAME, route_prefix="/")
    logger.info(
        "%d replicas of the %s retriever serve http://%s:%d",
        ray_config.replicas,
        retriever_config.retrieval_method,
        service_config.host,
        service_config.port,
    )
    return shards


def serve_on_ray(retriever_config: RetrieverConfig, service_config: ServiceConfig, ray_config: RayServeConfig) -> None:
    """Deploy on the configured Ray cluster and serve until interrupted (Ctrl-C, SIGTERM)."""
    import ray
    from ray import serve

    for name in ("index_path", "corpus_path", "bm25_index_path"):
        value = getattr(retriever_config, name)
        if value and not Path(value).exists():
            raise FileNotFoundError(f"{name} {value} does not exist (the replicas would fail to load it)")
    address = ray_config.address or os.environ.get("RAY_ADDRESS") or None
    ray.init(address=address, namespace=NAMESPACE)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    shards = deploy(retriever_config, service_config, ray_config)
    try:
        stop.wait()
    except KeyboardInterrupt:
        pass
    finally:
        serve.delete(APP_NAME)
        serve.shutdown()
        if shards is not None:
            shards.close()
        ray.shutdown()
