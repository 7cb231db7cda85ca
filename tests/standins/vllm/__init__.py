"""Test stand-in for vLLM's import surface used by OpenRLHF's rollout side: see tests/standins/README.md.

``SamplingParams`` is r3rag's own engine-neutral one (the fields the HF engine honours).
"""

from r3_env.hf_engine import SamplingParams  # noqa: F401

__version__ = "0.0.0+standin"
