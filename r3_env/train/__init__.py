"""Single-machine training: cold-start SFT then PPO with OpenRLHF's own RL functions, and the demo's model factory."""
