"""r3_env: the step-by-step reasoning-and-retrieval environment that r3rag plugs into OpenRLHF.

Modules: ``protocol`` (how a trajectory looks as text), ``answers`` (normalisation, EM/F1),
``data`` (FlashRAG dataset and corpus files), ``world`` (the synthetic multi-hop world),
``retrieval`` (retrievers; services are reached only through their HTTP clients).
"""

__version__ = "0.1.0"
