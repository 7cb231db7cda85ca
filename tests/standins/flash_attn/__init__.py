"""Test stand-in for flash-attn (CUDA only): see tests/standins/README.md."""
