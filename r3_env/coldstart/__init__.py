"""Cold start: Algorithm 1 synthesises trajectories with a teacher, Algorithm 2 makes SFT data.

The method and the paper's settings: docs/recipes/r3-rag.md#stage-1-cold-start.

- :mod:`.teacher`: the OpenAI-compatible teacher (rate limit, retries) and the teacher interface;
- :mod:`.scripted`: the synthetic world's scripted teacher (gold decompositions, detours);
- :mod:`.synth`: Algorithm 1 (rejection sampling, best-of-N, resumable outputs, usage summary);
- :mod:`.records`: the trajectory record and the turns it stands for;
- :mod:`.sft_data`: Algorithm 2 (multi-turn transcripts or per-step examples for OpenRLHF).
"""
