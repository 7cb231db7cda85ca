"""Test stand-in: vllm.inputs.TokensPrompt."""

TokensPrompt = dict
