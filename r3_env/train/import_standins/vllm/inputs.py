"""Stand-in: vllm.inputs.TokensPrompt."""

TokensPrompt = dict
