"""reward_server: the FastAPI service that hosts the LLM judge for document relevance and answer correctness.

It may import ``r3_env`` (protocol, answers); ``r3_env`` reaches it only through its HTTP client.
Its judges, cache and app arrive with the reward-server issue.
"""
