"""Run one multi-turn rollout batch through OpenRLHF's own vLLM rollout actor with r3rag's agent (vLLM CPU).

    .venv-vllm/bin/python tests/vllm_rollout_check.py SPEC.json OUT.json

Run by tests/test_vllm_rollout.py in .venv-vllm (scripts/setup_vllm.sh). SPEC names the model
folder, the services, the agent file and the questions. OpenRLHF's ``RolloutRayActor`` builds
vLLM's ``AsyncLLMEngine``, loads the agent with its own loader, and ``generate_responses`` runs the
samples concurrently, exactly as in training. vLLM's structured outputs constrain the random
model to well-formed query steps, so every episode is multi-turn (real sampling within the regex).
"""

from __future__ import annotations

import json
import os
import sys
import time


def main() -> None:
    spec = json.loads(open(sys.argv[1]).read())
    import ray
    from openrlhf.trainer.ray.vllm_engine import RolloutRayActor
    from transformers import AutoTokenizer
    from vllm import SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    env_vars = {
        "R3RAG_AGENT_OVERRIDES": json.dumps(spec["overrides"]),
        "VLLM_CPU_OMP_THREADS_BIND": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "0-1"),
        "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
        "VLLM_CPU_KVCACHE_SPACE": "2",
    }
    ray.init(
        num_cpus=4,
        runtime_env={"worker_process_setup_hook": spec["setup_hook"], "env_vars": env_vars},
        include_dashboard=False,
    )
    actor = RolloutRayActor.options(num_cpus=1).remote(
        model=spec["model"],
        enforce_eager=True,
        tensor_parallel_size=1,
        seed=0,
        distributed_executor_backend="uni",
        max_model_len=4096,
        enable_prefix_caching=True,
        dtype="float32",
        trust_remote_code=True,
        full_determinism=False,
        num_gpus=0,
        enable_sleep_mode=False,
        worker_extension_cls="openrlhf.trainer.ray.vllm_worker_wrap.WorkerWrap",
        agent_func_path=spec["agent"],
        remote_rm_url=None,
    )
    tokenizer = AutoTokenizer.from_pretrained(spec["model"])
    params = SamplingParams(
        temperature=1.0,
        max_tokens=None,
        logprobs=1,
        structured_outputs=StructuredOutputsParams(regex=spec["regex"]),
    )
    started = time.perf_counter()
    refs = [
        actor.generate_responses.remote(
            prompt=row["question"],
            label=json.dumps(row["golden_answers"]),
            sampling_params=params,
            max_length=spec["max_length"],
            hf_tokenizer=tokenizer,
            num_samples=spec["samples"],
        )
        for row in spec["rows"]
    ]
    responses = [response for batch in ray.get(refs) for response in batch]
    wall = time.perf_counter() - started
    out = []
    for response in responses:
        tokens = response["observation_tokens"]
        out.append(
            {
                "action_ranges": response["action_ranges"],
                "step_rewards": response.get("step_rewards"),
                "reward": response["reward"],
                "extra_logs": response["extra_logs"],
                "logprobs": len(response["rollout_log_probs"] or []),
                "tokens": len(tokens),
                "feedback": [
                    tokenizer.decode(tokens[end:start])
                    for (_, end), (start, _) in zip(
                        response["action_ranges"], response["action_ranges"][1:], strict=False
                    )
                ],
                "actions": [tokenizer.decode(tokens[s:e]) for s, e in response["action_ranges"]],
            }
        )
    with open(sys.argv[2], "w") as handle:
        json.dump({"wall_s": wall, "responses": out}, handle)
    ray.shutdown()


if __name__ == "__main__":
    main()
