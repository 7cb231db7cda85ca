"""Stand-in: vllm.utils.random_uuid."""

import uuid


def random_uuid() -> str:
    return uuid.uuid4().hex
