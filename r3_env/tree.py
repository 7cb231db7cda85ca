"""R2AG's Reasoning-Augmented Retrieval Tree (RRT): expand with a steering policy, keep the top survivors, prune.

The root is the question (and the documents an expansion starts from). At each iteration every
frontier vertex is shown to the steering policy with the documents on its path; the policy writes
one ``multi_query`` step (a reasoning, base queries, predicted queries, or stop). All the queries of
the iteration are retrieved top-k in ONE batched call, and each becomes a child vertex holding its
documents. Top-Survivor keeps, per expanded vertex, the first ``survivors_base`` base queries and the
first ``survivors_predicted`` predicted ones in the order the policy wrote them (the order the
Top-t/x AP reward trains). A survivor is expanded at the next iteration when its step did not
signal stop and its documents added something to its own path (branches may meet: each finds what
the other found first); survivors whose paths hold the same documents are expanded once. Expansion
ends when the frontier empties or after ``max_iterations`` (L_MAX).

The tree records every vertex (query, documents, gold hits), so the same code serves evaluation
(:func:`tree_metrics`: Recall, Full-Recall, AP, documents retrieved) and progressive training
(:func:`prune_to_gold`: the branches that found gold documents, whose documents start the next
round's prompts).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from r3_env.data import Passage
from r3_env.protocol import FormatError, StepFormat
from r3_env.retrieval.base import Hit
from r3_env.retrieval.metrics import retrieval_quality

if TYPE_CHECKING:
    from r3_env.engines import TokenEngine

logger = logging.getLogger(__name__)

# One vertex's step: (question, documents on the vertex's path) -> the policy's output text.
Steer = Callable[[str, Sequence[Passage]], Awaitable[str]]
# Many queries in, each one's top-k hits out (one batched request to the retrieval service).
SearchMany = Callable[[Sequence[str], int], Awaitable[list[list[Hit]]]]


@dataclass(frozen=True)
class TreeConfig:
    """Expansion rules (docs/recipes/r2ag.md#the-retrieval-tree); R2AG's are its recipe's
    (``load_recipe("r2ag").tree_config()``: k = 1 in training, 1 or 2 at inference; L_MAX 5)."""

    topk: int  # documents per query
    max_iterations: int  # L_MAX
    survivors_base: int  # t for base queries (the paper: the dataset's maximum hop count M)
    survivors_predicted: int  # t for predicted queries (the paper: M / 2)
    max_frontier: int = 16  # vertices expanded per iteration at most, breadth-first (bounds a bad policy's cost)
    max_query_chars: int = 1024

    def __post_init__(self) -> None:
        for name in ("topk", "max_iterations", "survivors_base", "max_frontier", "max_query_chars"):
            if getattr(self, name) < 1:
                raise ValueError(f"tree.{name} must be at least 1, got {getattr(self, name)}")
        if self.survivors_predicted < 0:
            raise ValueError(f"tree.survivors_predicted must be 0 or more, got {self.survivors_predicted}")


@dataclass
class Vertex:
    """One retrieval: the query that made it, its documents, and what became of it.

    ``kind`` is "root", "base" or "predicted". ``step`` is what the policy wrote when this vertex
    was expanded (its analysis, or the format error): empty for a vertex never expanded.
    """

    id: int
    parent: int | None
    depth: int
    kind: str
    query: str
    documents: list[Passage] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)
    new_gold: list[str] = field(default_factory=list)  # gold documents first retrieved here
    survived: bool = False  # Top-Survivor kept it for expansion
    expanded: bool = False
    analysis: str = ""
    format_error: str | None = None
    stop: bool = False  # its step signalled stop

    def to_json(self) -> dict[str, Any]:
        row = asdict(self)
        row["documents"] = [p.to_json() for p in self.documents]
        return row

    @classmethod
    def from_json(cls, row: dict[str, Any]) -> Vertex:
        return cls(**{**row, "documents": [Passage(d["id"], d["contents"]) for d in row["documents"]]})


@dataclass
class Tree:
    """A question's RRT in expansion order (vertex ids are list positions)."""

    question: str
    gold_ids: list[str]
    vertices: list[Vertex]
    iterations: int = 0
    generation_s: float = 0.0
    retrieval_s: float = 0.0
    wall_s: float = 0.0

    @property
    def root(self) -> Vertex:
        return self.vertices[0]

    def path(self, vertex: Vertex) -> list[Vertex]:
        """The vertices from the root to ``vertex``."""
        chain = [vertex]
        while chain[-1].parent is not None:
            chain.append(self.vertices[chain[-1].parent])
        return chain[::-1]

    def context(self, vertex: Vertex) -> list[Passage]:
        """The documents on the path to ``vertex``, each once, in retrieval order."""
        seen: dict[str, Passage] = {}
        for v in self.path(vertex):
            for passage in v.documents:
                seen.setdefault(passage.id, passage)
        return list(seen.values())

    def retrieved(self) -> list[Passage]:
        """Every document the expansion retrieved (not the root's starting documents), each once, in order."""
        seen: dict[str, Passage] = {}
        for vertex in self.vertices[1:]:
            for passage in vertex.documents:
                seen.setdefault(passage.id, passage)
        return list(seen.values())

    def gold_found(self) -> list[str]:
        """Gold ids in the starting documents or retrieved, in the order found."""
        gold = set(self.gold_ids)
        found = dict.fromkeys(p.id for p in self.root.documents if p.id in gold)
        for vertex in self.vertices[1:]:
            found.update(dict.fromkeys(vertex.new_gold))
        return list(found)

    @property
    def complete(self) -> bool:
        return bool(self.gold_ids) and set(self.gold_ids) <= set(self.gold_found())

    def to_json(self) -> dict[str, Any]:
        return {
            "question": self.question,
            "gold_ids": self.gold_ids,
            "iterations": self.iterations,
            "generation_s": self.generation_s,
            "retrieval_s": self.retrieval_s,
            "wall_s": self.wall_s,
            "vertices": [v.to_json() for v in self.vertices],
        }

    @classmethod
    def from_json(cls, row: dict[str, Any]) -> Tree:
        vertices = [Vertex.from_json(v) for v in row["vertices"]]
        fields = {k: row[k] for k in ("iterations", "generation_s", "retrieval_s", "wall_s") if k in row}
        return cls(row["question"], list(row["gold_ids"]), vertices, **fields)


async def expand_tree(
    question: str,
    steer: Steer,
    search_many: SearchMany,
    step_format: StepFormat,
    config: TreeConfig,
    gold_ids: Sequence[str] = (),
    context: Sequence[Passage] = (),
) -> Tree:
    """Grow the RRT of ``question`` from ``context`` (the root's documents; empty for a fresh question).

    ``gold_ids`` only label the record (new gold per vertex); expansion never looks at them.
    """
    started = time.perf_counter()
    gold = set(gold_ids)
    root = Vertex(0, None, 0, "root", question, list(context), survived=True)
    tree = Tree(question, list(gold_ids), [root])
    seen = {p.id for p in context}
    frontier = [root]
    for depth in range(1, config.max_iterations + 1):
        if not frontier:
            break
        tree.iterations = depth
        began = time.perf_counter()
        outputs = await asyncio.gather(*(steer(question, tree.context(v)) for v in frontier))
        tree.generation_s += time.perf_counter() - began
        children: list[Vertex] = []
        for vertex, text in zip(frontier, outputs, strict=True):
            vertex.expanded = True
            try:
                step = step_format.read_turn(text, after_documents=bool(tree.context(vertex)))
            except FormatError as error:
                vertex.format_error = error.reason.value
                continue
            vertex.analysis, vertex.stop = step.analysis, step.stop
            kinds = [("base", q) for q in step.queries] + [("predicted", q) for q in step.predicted]
            for kind, query in kinds or [("base", q) for q in step.searches]:
                children.append(Vertex(len(tree.vertices) + len(children), vertex.id, depth, kind, query))
        if not children:
            break
        began = time.perf_counter()
        hits = await search_many([c.query[: config.max_query_chars] for c in children], config.topk)
        tree.retrieval_s += time.perf_counter() - began
        taken: dict[tuple[int | None, str], int] = {}
        next_frontier, paths = [], set()
        for child, found in zip(children, hits, strict=True):
            child.documents = [hit.passage for hit in found]
            child.scores = [float(hit.score) for hit in found]
            fresh = [p.id for p in child.documents if p.id not in seen]
            child.new_gold = [i for i in dict.fromkeys(fresh) if i in gold]
            seen.update(fresh)
            rank = taken[(child.parent, child.kind)] = taken.get((child.parent, child.kind), 0) + 1
            limit = config.survivors_base if child.kind == "base" else config.survivors_predicted
            child.survived = rank <= limit
            parent = tree.vertices[child.parent]
            # it goes on when it added a document to its own path (branches may meet); equal paths go on once
            path = frozenset(p.id for p in tree.context(parent)) | {p.id for p in child.documents}
            grew = len(path) > len({p.id for p in tree.context(parent)})
            if child.survived and grew and not parent.stop and path not in paths:
                paths.add(path)
                next_frontier.append(child)
        tree.vertices.extend(children)
        if len(next_frontier) > config.max_frontier:
            logger.debug("frontier of %d vertices cut to %d", len(next_frontier), config.max_frontier)
        frontier = next_frontier[: config.max_frontier]
    tree.wall_s = time.perf_counter() - started
    return tree


def prune_to_gold(tree: Tree) -> list[Vertex]:
    """The vertices on branches that found gold documents (bottom-up: a vertex stays when it or a
    descendant found new gold), root first; an incomplete tree keeps at least its root."""
    keep = {0}
    for vertex in reversed(tree.vertices[1:]):
        if vertex.new_gold or vertex.id in keep:
            keep.add(vertex.id)
            keep.add(vertex.parent)
    return [v for v in tree.vertices if v.id in keep]


def gold_documents(tree: Tree) -> list[Passage]:
    """The gold documents the tree holds (starting ones, then as found): the next round's context."""
    gold = set(tree.gold_ids)
    found: dict[str, Passage] = {}
    for vertex in prune_to_gold(tree):
        for passage in vertex.documents:
            if passage.id in gold:
                found.setdefault(passage.id, passage)
    return list(found.values())


def tree_metrics(tree: Tree) -> dict[str, float]:
    """Recall, Full-Recall, AP over the retrieval order, documents retrieved (@K), iterations, seconds."""
    retrieved = [p.id for p in tree.retrieved()]
    return {
        **retrieval_quality(retrieved, tree.gold_ids),
        "num_docs": float(len(retrieved)),
        "iterations": float(tree.iterations),
        "generation_s": tree.generation_s,
        "retrieval_s": tree.retrieval_s,
        "wall_s": tree.wall_s,
    }


def token_steerer(
    renderer: Any, engine: TokenEngine, sampling_params: Any, max_tokens: int, max_length: int | None = None
) -> Steer:
    """A Steer over a :class:`~r3_env.engines.TokenEngine` (HFEngine, vLLM).

    ``renderer`` is a :class:`r3_env.protocol.ChatRenderer` in the multi_query format; the step ends at
    the chat template's turn end.
    """
    import copy

    tokenizer = renderer.tokenizer
    special = set(getattr(tokenizer, "all_special_ids", []))

    async def steer(question: str, context: Sequence[Passage]) -> str:
        ids = tokenizer(renderer.prompt(question, context), add_special_tokens=False)["input_ids"]
        params = copy.deepcopy(sampling_params)
        room = max_tokens if max_length is None else min(max_tokens, max_length - len(ids))
        if room <= 0:
            return ""  # the documents filled the context: an empty step (a format error)
        params.max_tokens = room
        params.stop_token_ids = list(dict.fromkeys([*(params.stop_token_ids or []), *renderer.stop_token_ids]))
        output = (await engine.generate(ids, params)).outputs[0]
        tokens = list(output.token_ids)
        if output.finish_reason == "stop" and tokens and tokens[-1] in special:
            tokens = tokens[:-1]
        return tokenizer.decode(tokens, skip_special_tokens=False)

    return steer


def oracle_steerer(
    plans: dict[str, Sequence[tuple[str, str]]], step_format: StepFormat, hops_per_step: int = 0
) -> Steer:
    """The upper bound of the machinery: a policy that knows each question's hops from its annotation.

    ``plans`` maps a question to its (query, gold id) hops. At a vertex it writes a base query for
    each hop whose gold document is not on the vertex's path (the first ``hops_per_step``, or as
    many as the format allows), and the stop signal alone once none is missing.
    """
    from r3_env.protocol import Step

    async def steer(question: str, context: Sequence[Passage]) -> str:
        have = {p.id for p in context}
        missing = [query for query, gold in plans[question] if gold not in have]
        missing = missing[: hops_per_step or getattr(step_format, "max_base", None) or len(missing)]
        if not missing:
            return step_format.render_step(Step("The documents found so far hold every fact needed.", stop=True))
        return step_format.render_step(Step("Each missing fact needs its own query.", queries=tuple(missing)))

    return steer
