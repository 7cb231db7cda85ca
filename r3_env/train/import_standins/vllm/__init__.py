"""r3rag's import stand-in for the vLLM names OpenRLHF imports: see r3_env/train/openrlhf_cpu.py.

``SamplingParams`` is r3rag's engine-neutral one (the fields the HF engine honours).
"""

from r3_env.engines import SamplingParams  # noqa: F401

__version__ = "0.0.0+r3rag-standin"
