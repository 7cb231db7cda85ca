"""Retrieval: indexes and retrievers over FlashRAG corpora.

The environment and evaluation reach a retrieval *service* only through its HTTP client; the
in-process retrievers here serve tests, the demo and tools such as the world's difficulty check.
"""
