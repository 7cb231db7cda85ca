"""r3rag's import stand-in for flash-attn (CUDA only): see r3_env/train/openrlhf_cpu.py."""

__version__ = "0.0.0+r3rag-standin"
