"""The regex controller's load (compile, init, snapshot, compile again: from an empty cache) and a new
request's first mask (new_request + spawn + the prompt's step through the rows API, median of 5)
for one build, in a fresh process and cache directory: what the init's standard slices cost.

Usage: python bench/regex_init_cost.py BUILD.wasm   (run it per build, alternating)
"""
import os, sys, time, tempfile
from pathlib import Path
d = tempfile.mkdtemp(); os.environ["XDG_CACHE_HOME"] = d
sys.path.insert(0, "bench"); sys.path.insert(0, "tests")
from mask_speed import QwenTokenizer
import aicirt, numpy as np
tok = QwenTokenizer(); prompt = tok.encode("Answer: ")
rt = aicirt.Runtime(tok, limits=aicirt.Limits(first_call_timeout_s=30.0), workers=1)
t0 = time.perf_counter(); c = rt.load(Path(sys.argv[1])); load = time.perf_counter() - t0
size = sum(f.stat().st_size for f in Path(d).rglob("*") if f.is_file())
ttfm = {}
for name, pat in (("identifier", b"[a-zA-Z_][a-zA-Z0-9_]*"), ("email", b"[a-z0-9._]+@[a-z0-9]+\\.(com|org|net)"), ("quoted", b'[^"]*"'), ("year", b"(19|20)[0-9]{2}")):
    xs = []
    for _ in range(5):
        t0 = time.perf_counter()
        req = rt.new_request(c, arg=pat); seq = req.spawn()
        rt.submit_rows(np.array([seq.index], np.int64), np.array([-1], np.int32), {0: (prompt, 0)}).wait()
        xs.append((time.perf_counter() - t0) * 1e3)
        seq.close(); req.close()
    ttfm[name] = round(sorted(xs)[2], 2)
print(Path(sys.argv[1]).name, f"load (compile, init, snapshot, compile) {load*1e3:.0f} ms; disk cache {size/2**20:.1f} MiB; new request to first mask, median of 5, ms: {ttfm}", flush=True)
rt.close()
