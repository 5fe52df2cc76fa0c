"""Adapters that run aicirt controllers inside other inference engines.

`aicirt.integrations.steering` is the engine-independent core (numpy only): one controller per
request, for hosts that append exactly one token per step and can only mask logits.
`aicirt.integrations.vllm` is the vLLM V1 logits-processor layer over it; it imports vLLM and
torch, so nothing here is imported by `import aicirt`.
"""
