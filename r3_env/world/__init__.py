"""The embedded default: a synthetic multi-hop world (corpus and questions in FlashRAG formats).

``generate_world(WorldConfig(entities=2000, seed=0), "runs/world")`` or ``r3rag world``. The demo,
the tests and the benchmarks use it when no real data is given.
"""

from r3_env.world.build import WorldConfig, generate_world
from r3_env.world.graph import World

__all__ = ["World", "WorldConfig", "generate_world"]
