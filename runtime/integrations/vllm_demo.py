"""`make demo-vllm`: shipped controllers steering vLLM (CPU build) on the default model.

    python -m aicirt.integrations.vllm_demo [--model DIR]
"""
from __future__ import annotations

import argparse
import time

DEMOS = [
    ("regex", "(19|20)[0-9]{2}", "In which year did World War II end?"),
    ("yesno", "", "Is Paris the capital of France?"),
    ("countdown", "5", "Count down from five:"),
    (None, None, "The capital of France is"),
]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="a Hugging Face model folder (default: SmolLM2, converted)")
    args = ap.parse_args(argv)
    from vllm import SamplingParams

    from ..engine.vllm_engine import vllm_dtype
    from .vllm_offline import default_llm

    t0 = time.perf_counter()
    llm = default_llm(args.model)
    print(f"model loaded in {time.perf_counter() - t0:.0f} s ({vllm_dtype()}: bfloat16 only where the CPU has it)")
    params = [SamplingParams(temperature=0.0, max_tokens=32,
                             extra_args=None if c is None else {"aicirt_controller": c, "aicirt_arg": a})
              for c, a, _ in DEMOS]
    t0 = time.perf_counter()
    outs = llm.generate([p for _, _, p in DEMOS], params, use_tqdm=False)
    dt = time.perf_counter() - t0
    for (c, a, prompt), o in zip(DEMOS, outs):
        label = f"{c} {a!r}" if c else "(no controller)"
        print(f"\n[{label}] {prompt}\n  -> {o.outputs[0].text!r} ({o.outputs[0].finish_reason})")
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    print(f"\n{tokens} tokens for {len(DEMOS)} requests in one batch, {dt:.1f} s")


if __name__ == "__main__":   # vLLM spawns its engine core, which imports this module again
    main()
