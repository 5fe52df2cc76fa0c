"""Adapters that run aicirt controllers inside other inference engines.

`aicirt.integrations.steering` is the engine-independent core (numpy only): one controller per
request, for hosts that append exactly one token per step and can only mask logits.
`aicirt.integrations.vllm` is the vLLM V1 logits-processor layer over it, and
`aicirt.integrations.vllm_mrv2` the Model Runner V2 one (draft rows masked through
`aicirt.core.speculate`); the V1 class name loads under either runner. They import vLLM and torch, so
nothing here is imported by `import aicirt`. `aicirt.integrations.vllm_dp` (and `vllm_dp_app`, its
front server) runs `aicirt serve --engine vllm --data-parallel-size N`: N vLLM-engine servers
behind one.
"""
