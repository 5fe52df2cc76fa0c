"""What the whole protocol costs on vLLM (`aicirt.engine.vllm_engine`), in forward passes and
KV recomputed, beside the own engine and the logits-processor plugin, in one run.

1. `forward_passes_per_token`: the program controller's fixed-key JSON form (bench/program.py's
   FORM, greedy, SmolLM2) on the vLLM engine (vLLM steps that ran the model for the request), the
   own engine (the transformers backend's forward calls) and the plugin (`vllm.LLM` with
   `AicirtLogitsProcessor`: one forward pass a token by construction, every fast-forwarded token
   forced one a step), over the tokens in the final text.
2. `ff_extra_passes`: forward passes of a controller that samples, fast-forwards 60 tokens,
   samples, stops, minus those of the same controller without the fast-forward (vLLM engine; the
   own engine and the plugin beside it). The step that returns the fast-forward is one pass whose
   logits are unused; the 60 tokens go through the next pass with the token after them.
3. `backtrack_recomputed_tokens`: a backtrack of 8 tokens at 500 tokens of context: the tokens
   vLLM computes again when the edited request restarts (its tokens minus the prefix-cache hits).
4. `fork_shared_blocks`: a fork into 4 at 500 tokens of context: the KV blocks each new branch
   took from the prefix cache (the least over branches) against the prefix's full blocks.
5. `tp2_identical`: tests/test_vllm_engine_tp.py's workload at TP 1 and TP 2 (each its own
   process; random-weight Llama, float32) gives identical outputs. `--no-tp` skips it.

    python bench/vllm_protocol.py [--form-prompts 3] [--no-tp] [--no-plugin]

Raw output: bench/results/vllm_protocol.txt. The last line is one JSON object.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

from _common import ForwardCounter  # noqa: E402

FF = list(range(1024, 1084))                  # every byte of the script < 0x80: the plugin takes it as text
CONTEXT = [1000 + (i * 37) % 5000 for i in range(500)]      # 500 tokens of context, no two blocks alike


def _scripts():
    from scripted import branch, result, script, splice, stop

    return {
        "ff60": script(result(branch(mask=[65])), result(branch(splices=[splice(ff=FF)])),
                       result(branch(mask=[66])), stop()),
        "no_ff": script(result(branch(mask=[65])), result(branch(mask=[66])), stop()),
        "backtrack8": script(result(branch(mask=[65])), result(branch(splices=[splice(backtrack=8)])),
                             result(branch(mask=[66])), stop()),
        "fork4": script(result(branch(mask=[65])),
                        result(branch(mask=[41]), branch(mask=[42]), branch(mask=[43]), branch(mask=[44])), stop()),
    }


def _form_passes(eng, passes_now, n: int) -> dict:
    """The fixed-key form's program on `n` prompts through `eng`: forward passes (read by
    `passes_now()`) and tokens generated, with the texts."""
    from program import FORM, FORM_PROMPTS

    from aicirt import program as P
    from aicirt.engine import SamplingParams
    from aicirt.build.toolchain import build_cached

    passes = tokens = 0
    texts = []
    for prompt in (FORM_PROMPTS * 4)[:n]:
        p0 = passes_now()
        req = eng.generate(prompt, build_cached("program"), P.json(FORM).dumps().encode(),
                           params=SamplingParams(max_tokens=160))
        passes += passes_now() - p0
        tokens += len(req.sequences[0].output_tokens)
        texts.append(req.sequences[0].text)
    return {"passes": passes, "tokens": tokens, "per_token": round(passes / tokens, 3), "texts": texts}


def form_passes_own(n: int) -> dict:
    from aicirt.engine import Engine
    from aicirt.engine.backends import load_backend

    backend = load_backend(None)
    counter = ForwardCounter(backend)
    with Engine(backend) as eng:
        out = _form_passes(eng, lambda: counter.calls, n)
    del out["texts"]
    return out


def form_passes_vllm(eng, n: int) -> dict:
    return _form_passes(eng, lambda: eng.passes, n)


def scripted_passes_own(scripts: dict) -> dict:
    """Forward calls of the own engine (scripted backend over SmolLM2's tokenizer) per script."""
    import aicirt
    from aicirt.runner.arg_check import model_tokenizer
    from aicirt.engine import Engine, SamplingParams
    from aicirt.engine.backends import ScriptedBackend
    from aicirt.build.toolchain import build_cached

    tok = model_tokenizer(None)
    out = {}
    with aicirt.Runtime(tok, cache_dir=False) as rt:
        ctrl = rt.load(build_cached(ROOT / "tests" / "controllers" / "scripted.c", sdk=False))
        for name in ("ff60", "no_ff"):
            backend = ScriptedBackend(tok)
            Engine(backend, rt).generate([504, 3575, 282, 4649, 314], ctrl, scripts[name],
                                         params=SamplingParams(max_tokens=100))
            out[name] = len(backend.calls)
    return out


def vllm_protocol(eng, scripts: dict) -> dict:
    from aicirt.engine import SamplingParams
    from aicirt.build.toolchain import build_cached

    ctrl = eng.runtime.load(build_cached(ROOT / "tests" / "controllers" / "scripted.c", sdk=False))
    out: dict = {}
    for name in ("ff60", "no_ff"):
        p0 = eng.passes
        req = eng.generate([504, 3575, 282, 4649, 314], ctrl, scripts[name], params=SamplingParams(max_tokens=100))
        out[name] = eng.passes - p0
        out[name + "_tokens"] = req.sequences[0].output_tokens
    n0 = len(eng.starts)
    req = eng.generate(CONTEXT, ctrl, scripts["backtrack8"], params=SamplingParams(max_tokens=100))
    starts = [x for x in list(eng.starts)[n0:] if x[0] == req.id]
    assert req.sequences[0].tokens == CONTEXT[:-7] + [66], req.sequences[0].tokens[-10:]
    restart = starts[1]          # the first start is the prompt; the next, the backtracked tokens
    out["backtrack"] = {"starts": starts, "recomputed_tokens": restart[3], "context": restart[2],
                        "block_size": eng.block_size}
    n0 = len(eng.starts)
    req = eng.generate(CONTEXT, ctrl, scripts["fork4"], params=SamplingParams(max_tokens=100))
    starts = [x for x in list(eng.starts)[n0:] if x[0] == req.id]
    children = [x for x in starts if x[1] > 0]
    assert len(children) == 3 and [s.output_tokens for s in req.sequences] == [[65, 41], [65, 42], [65, 43], [65, 44]]
    prefix = len(CONTEXT) + 1
    shared = [(tokens - computed) // eng.block_size for _, _, tokens, computed in children]
    out["fork"] = {"starts": starts, "shared_blocks_per_branch": shared, "prefix_tokens": prefix,
                   "prefix_full_blocks": prefix // eng.block_size}
    return out


PLUGIN = r'''
import json, sys
sys.path.insert(0, sys.argv[1] + "/tests"); sys.path.insert(0, sys.argv[1] + "/bench")
if __name__ == "__main__":
    from vllm import SamplingParams
    from aicirt.integrations.vllm_offline import default_llm, shutdown
    from aicirt import program as P
    from aicirt.build.toolchain import build_cached
    from program import FORM, FORM_PROMPTS
    scripts = json.loads(sys.argv[2]); n = int(sys.argv[3])
    llm = default_llm()
    wasm = str(build_cached(sys.argv[1] + "/tests/controllers/scripted.c", sdk=False))
    out = {}
    tok = llm.get_tokenizer()
    for name in ("ff60", "no_ff"):
        o = llm.generate([{"prompt_token_ids": [504, 3575, 282, 4649, 314]}], SamplingParams(max_tokens=100,
            temperature=0, extra_args={"aicirt_controller": wasm, "aicirt_arg": bytes.fromhex(scripts[name]).decode("ascii")}),
            use_tqdm=False)
        out[name] = len(o[0].outputs[0].token_ids)
    tokens = 0
    for prompt in (FORM_PROMPTS * 4)[:n]:
        chat = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False)
        o = llm.generate([chat], SamplingParams(max_tokens=160, temperature=0, extra_args={
            "aicirt_controller": "program", "aicirt_arg": P.json(FORM).dumps()}), use_tqdm=False)
        tokens += len(o[0].outputs[0].token_ids)
    out["form_tokens"] = tokens
    print("PLUGIN " + json.dumps(out))
    shutdown(llm)
'''


def plugin(scripts: dict, n: int) -> dict | None:
    """The logits-processor plugin in a process of its own (vLLM's engine-core process): passes are
    the tokens it generated (one sampled or forced token a step, one request at a time)."""
    env = dict(os.environ, AICIRT_VLLM_ALLOW_PATHS="1")
    proc = subprocess.run([sys.executable, "-c", PLUGIN, str(ROOT), json.dumps({k: v.hex() for k, v in scripts.items()}),
                           str(n)], capture_output=True, text=True, env=env, timeout=1200)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("PLUGIN ")), None)
    if line is None:
        print(proc.stderr[-3000:], file=sys.stderr)
        return None
    return json.loads(line[7:])


def tp2_identical() -> dict:
    sys.path.insert(0, str(ROOT / "tests"))
    from test_vllm_engine_tp import make_model

    with tempfile.TemporaryDirectory() as tmp:
        model = make_model(Path(tmp) / "tiny-llama")
        outs = []
        for tp in (1, 2):
            env = dict(os.environ)
            if tp == 2:
                env["VLLM_CPU_OMP_THREADS_BIND"] = "0|1"
            path = Path(tmp) / f"tp{tp}.json"
            t0 = time.perf_counter()
            proc = subprocess.run([sys.executable, str(ROOT / "tests" / "test_vllm_engine_tp.py"), str(model), str(tp),
                                   str(path)], env=env, capture_output=True, text=True, timeout=1200)
            if proc.returncode != 0:
                print(proc.stderr[-3000:], file=sys.stderr)
                return {"identical": False, "error": f"tp {tp} failed"}
            outs.append(json.loads(path.read_text()))
            print(f"TP {tp}: {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    return {"identical": outs[0] == outs[1], "requests": len(outs[0]) - 1,
            "sequences": sum(len(v["sequences"]) for k, v in outs[0].items() if k != "_limits")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--form-prompts", type=int, default=3)
    ap.add_argument("--no-tp", action="store_true")
    ap.add_argument("--no-plugin", action="store_true")
    args = ap.parse_args()
    print(f"load before: {open('/proc/loadavg').read().strip()}", flush=True)
    scripts = _scripts()
    from aicirt.engine.vllm_engine import VllmEngine

    t0 = time.perf_counter()
    eng = VllmEngine(max_model_len=1024)
    print(f"vLLM engine: {eng.engine_args['dtype']}, block size {eng.block_size}, loaded in "
          f"{time.perf_counter() - t0:.0f} s", flush=True)
    try:
        proto = vllm_protocol(eng, scripts)
        form_v = form_passes_vllm(eng, args.form_prompts)
    finally:
        eng.close()
    print(f"vLLM engine: ff60 {proto['ff60']} passes, no_ff {proto['no_ff']} -> ff_extra_passes "
          f"{proto['ff60'] - proto['no_ff']}", flush=True)
    print(f"vLLM engine: backtrack 8 at {len(CONTEXT)} tokens: restarts with {proto['backtrack']['context']} tokens, "
          f"computes {proto['backtrack']['recomputed_tokens']} (block size {proto['backtrack']['block_size']}); "
          f"starts {proto['backtrack']['starts']}", flush=True)
    print(f"vLLM engine: fork of 4 at {proto['fork']['prefix_tokens']} tokens: blocks shared per new branch "
          f"{proto['fork']['shared_blocks_per_branch']} of {proto['fork']['prefix_full_blocks']} full prefix blocks; "
          f"starts {proto['fork']['starts']}", flush=True)
    print(f"vLLM engine: form {form_v['passes']} passes / {form_v['tokens']} tokens = {form_v['per_token']}; "
          f"texts {form_v['texts']}", flush=True)
    own_ff = scripted_passes_own(scripts)
    print(f"own engine: ff60 {own_ff['ff60']} forward calls, no_ff {own_ff['no_ff']}", flush=True)
    form_o = form_passes_own(args.form_prompts)
    print(f"own engine: form {form_o['passes']} passes / {form_o['tokens']} tokens = {form_o['per_token']}", flush=True)
    plug = None if args.no_plugin else plugin(scripts, args.form_prompts)
    if plug is not None:
        print(f"plugin: ff60 {plug['ff60']} tokens = passes, no_ff {plug['no_ff']}; form {plug['form_tokens']} tokens "
              f"= passes", flush=True)
    tp = None if args.no_tp else tp2_identical()
    if tp is not None:
        print(f"TP 2 vs TP 1: {tp}", flush=True)
    print(f"load after: {open('/proc/loadavg').read().strip()}", flush=True)
    print(json.dumps({
        "forward_passes_per_token": {"vllm_engine": form_v["per_token"], "own_engine": form_o["per_token"],
                                     "plugin": 1.0 if plug is not None else None},
        "form_tokens": {"vllm_engine": form_v["tokens"], "own_engine": form_o["tokens"],
                        "plugin": plug["form_tokens"] if plug else None},
        "ff_extra_passes": proto["ff60"] - proto["no_ff"],
        "ff_extra_passes_own": own_ff["ff60"] - own_ff["no_ff"],
        "ff_extra_passes_plugin": plug["ff60"] - plug["no_ff"] if plug else None,
        "backtrack_recomputed_tokens": proto["backtrack"]["recomputed_tokens"],
        "block_size": proto["backtrack"]["block_size"],
        "fork_shared_blocks": min(proto["fork"]["shared_blocks_per_branch"]),
        "fork_prefix_full_blocks": proto["fork"]["prefix_full_blocks"],
        "tp2_identical": tp["identical"] if tp is not None else None,
    }))


if __name__ == "__main__":   # vLLM may spawn processes that import this module again
    main()
