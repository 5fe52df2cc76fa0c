"""What `aicirt run` does: resolve the controller, load the model, stream a generation, summarise.

cli.py only parses options; everything here is importable and testable without click.
"""
from __future__ import annotations

import contextlib
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Callable
from typing import IO, TYPE_CHECKING, Any

from ..engine import Engine, Event, FinishEvent, ForkEvent, GenRequest, GenSeq, LogEvent, SamplingParams, TokensEvent
from ..errors import AicirtError, failure_message

if TYPE_CHECKING:
    from ..core.runtime import Runtime


class RunFailed(AicirtError):
    """A sequence ended in error, or the controller rejected its argument before the model loaded.

    The message is one line saying why, worded by `aicirt.errors.failure_message`: the
    controller's own reason (its last log line) first, then the runtime's error; `result` is the
    run's result dict when the run got that far (it has been printed already); `log` the
    controller's log when its first call, before the model loaded, failed.
    """

    def __init__(self, message: str, result: dict | None = None, log: str = ""):
        super().__init__(message)
        self.result = result
        self.log = log


def failure(result: dict) -> str | None:
    """One line naming the sequences of `result` that ended in error, or None if none did."""
    failed = [s for s in result["sequences"] if s["finish_reason"] == "error"]
    if not failed:
        return None
    first = failed[0]
    head = f"sequence #{first['label']} ended in error"
    if len(result["sequences"]) > 1:
        head = f"{len(failed)} of {len(result['sequences'])} sequences ended in error; #{first['label']}"
    return f"{head}: {failure_message(first['error'] or 'error', first['logs'] or '')}"


def resolve_controller(src: str, *, progress: bool = True) -> Path:
    """A `.wasm` path as is; a C/Zig file, a folder or a shipped controller's name built (cached).

    Raises `aicirt.build.toolchain.BuildError` with the compiler's diagnostics.
    """
    path = Path(src)
    if path.suffix == ".wasm":
        if not path.is_file():
            raise FileNotFoundError(f"{src}: no such file")
        return path
    from ..build import toolchain

    return Path(toolchain.build_cached(src, progress=progress))


def _valid_utf8_prefix(data: bytes) -> int:
    """Length of the longest prefix of `data` that does not end inside a UTF-8 character."""
    for cut in range(min(4, len(data)) + 1):
        try:
            data[: len(data) - cut].decode("utf-8")
            return len(data) - cut
        except UnicodeDecodeError as e:
            if e.reason != "unexpected end of data":
                return len(data)  # invalid bytes, not a truncated character: print with replacement
    return 0


@dataclass
class _View:
    tokens: list[int]
    printed: int                           # bytes of decode(tokens) already on the terminal
    data: bytes = b""


@dataclass
class StreamPrinter:
    """Streams each sequence's text as it changes; labels forks, shows backtracks struck through."""
    engine: Engine
    out: IO[str]
    err: IO[str]
    show_logs: bool = False
    color: bool = False
    views: dict[int, _View] = field(default_factory=dict)
    last: int | None = None
    at_line_start: bool = True
    out_ends_with_label: bool = False

    def _style(self, text: str, **kw: Any) -> str:
        import click

        return click.style(text, **kw) if self.color else text

    def start(self, req: GenRequest) -> None:
        data = self.engine.backend.decode_bytes(req.prompt)
        self.views[0] = _View(list(req.prompt), len(data), data)
        self.last = 0

    def _write(self, text: str) -> None:
        if text:
            self.out.write(text)
            self.at_line_start = text.endswith("\n")
            self.out_ends_with_label = False
            self.out.flush()

    def _switch_to(self, seq: GenSeq) -> None:
        if self.last == seq.label or len(seq.request.sequences) == 1:
            self.last = seq.label
            return
        if not self.at_line_start:
            self._write("\n")
        self._write(self._style(f"[#{seq.label}] ", fg="cyan"))
        self.out_ends_with_label = True
        self.last = seq.label

    def on_event(self, ev: Event) -> None:
        if isinstance(ev, ForkEvent):
            parent = self.views[ev.parent.label]
            self.views[ev.child.label] = _View(list(parent.tokens), parent.printed, parent.data)
            if not self.at_line_start:
                self._write("\n")
            self._write(self._style(f"[#{ev.parent.label} forked #{ev.child.label}]", fg="cyan", dim=True) + "\n")
            self.last = None
        elif isinstance(ev, TokensEvent):
            self._tokens(ev)
        elif isinstance(ev, LogEvent) and self.show_logs:
            for line in ev.text.rstrip("\n").split("\n"):
                self.err.write(self._style(f"[#{ev.seq.label} log] {line}", dim=True) + "\n")
            self.err.flush()
        elif isinstance(ev, FinishEvent) and len(ev.request.sequences) > 1:
            self._switch_to(ev.seq)
            why = ev.reason + (f": {ev.error}" if ev.error else "")
            gap = "" if self.at_line_start or self.out_ends_with_label else " "
            self._write(self._style(f"{gap}<{why}>", dim=True) + "\n")
            self.last = None

    def _tokens(self, ev: TokensEvent) -> None:
        view = self.views[ev.seq.label]
        if ev.backtrack:
            del view.tokens[len(view.tokens) - ev.backtrack:]
        view.tokens.extend(ev.tokens)
        new = self.engine.backend.decode_bytes(view.tokens)
        old = view.data
        common = 0
        limit = min(len(old), len(new), view.printed)
        while common < limit and old[common] == new[common]:
            common += 1
        self._switch_to(ev.seq)
        if common < view.printed:  # text that was shown is gone: show it struck through
            removed = old[common:view.printed].decode("utf-8", "replace")
            # In colour: the removed text struck through in red; in plain text: [⌫removed].
            self._write(self._style(removed, fg="red", strikethrough=True) if self.color else f"[⌫{removed}]")
            view.printed = common
        end = _valid_utf8_prefix(new)
        if end > view.printed:
            self._write(new[view.printed:end].decode("utf-8", "replace"))
            view.printed = end
        view.data = new


def _var_text(value: bytes) -> str | dict[str, str]:
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return {"hex": value.hex()}


def run(controller: str, *, arg: bytes = b"", prompt: str = "", max_tokens: int = SamplingParams.max_tokens,
        temperature: float = SamplingParams.temperature, seed: int | None = None, model: str | None = None,
        as_json: bool = False, show_logs: bool = False, chat: bool = True, top_p: float = SamplingParams.top_p,
        top_k: int = SamplingParams.top_k, out: IO[str] | None = None,
        err: IO[str] | None = None, color: bool | None = None, engine: str = "own",
        vllm_options: dict | None = None) -> dict:
    """`aicirt run`: run `controller` on `model` and stream (or, with `as_json`, print as JSON) what
    it generates, then a summary.

    Returns the result as the JSON form's dict (see :func:`generate`). Raises what `generate`
    raises, and `RunFailed` when a sequence ended in error (after printing the result).
    """
    out = out or sys.stdout
    err = err or sys.stderr
    color = (out.isatty() and not as_json) if color is None else color
    params = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, max_tokens=max_tokens, seed=seed)
    printers: list[StreamPrinter] = []

    def start(gen: Any, req: GenRequest) -> None:
        printers.append(StreamPrinter(gen, out, err, show_logs and not as_json, color))
        if not as_json:
            printers[0].start(req)

    def on_event(ev: Event) -> None:
        if not as_json:
            printers[0].on_event(ev)

    result = generate(controller, arg=arg, prompt=prompt, params=params, model=model, chat=chat, engine=engine,
                      vllm_options=vllm_options, on_start=start, on_event=on_event)
    if as_json:
        out.write(json.dumps(result, indent=2) + "\n")
    else:
        _summary(result, out, err, printers[0])
    why = failure(result)
    if why is not None:
        raise RunFailed(why, result)
    return result


def generate(controller: str, *, arg: bytes = b"", prompt: str = "", params: SamplingParams | None = None,
             model: str | None = None, chat: bool = True, engine: str = "own", vllm_options: dict | None = None,
             on_start: Callable[[Any, GenRequest], None] | None = None,
             on_event: Callable[[Event], None] | None = None) -> dict:
    """One request of `controller` on `model`, nothing printed: the result as `aicirt run --json`
    writes it (sequences with text, tokens, finish reasons, errors and logs; variables; timing).

    `controller` is resolved as `aicirt run` does (a `.wasm`, a source file or folder, a shipped
    name). The module is checked and the controller's first call tried on the model's tokenizer
    before the weights load. Raises `FileNotFoundError` (controller or model),
    `aicirt.LoadError` (bad module), `aicirt.build.toolchain.BuildError` (compile error),
    `RunFailed` when the first call, tried on the tokenizer alone, ends in error (see
    `aicirt.runner.arg_check`); a sequence that ends in error is in the result, not raised.
    `engine`: "own" (aicirt.engine) or "vllm" (`aicirt.engine.vllm_engine.VllmEngine`, with
    `vllm_options` as its keyword arguments). `on_start(engine, request)` and `on_event(event)`
    see the request and its events as they happen.
    """
    if engine not in ("own", "vllm"):
        raise ValueError(f"engine must be own or vllm, not {engine!r}")
    params = params or SamplingParams()
    wasm = resolve_controller(controller, progress=True)
    from .arg_check import same_tokenizer
    from ..engine.backends import load_backend
    from ..loader.controller import check_controller

    check_controller(wasm)   # a bad module fails now, in milliseconds, not after the model loads
    with contextlib.ExitStack() as stack:
        runtime = _checked_runtime(wasm, arg, prompt, model)   # RunFailed here: the model never loads
        if runtime is not None:
            stack.callback(runtime.close)
        t0 = time.perf_counter()
        if engine == "vllm":
            from ..engine.vllm_engine import VllmEngine

            vllm = stack.enter_context(VllmEngine(model, **(vllm_options or {})))
            backend: Any = vllm.backend
        else:
            backend = load_backend(model)
        load_s = time.perf_counter() - t0
        if runtime is not None and not same_tokenizer(runtime.tokenizer, backend.runtime_tokenizer()):
            runtime = None            # closed on the way out; the engine makes its own
        if engine == "vllm":
            if runtime is not None:
                vllm.use_runtime(runtime)
            gen: Any = vllm
        else:
            gen = stack.enter_context(Engine(backend, runtime))
        ctrl = gen.runtime.load(wasm)
        t1 = time.perf_counter()
        req = gen.add_request(prompt, ctrl, arg, params=params, chat=chat)
        if on_start is not None:
            on_start(gen, req)
        for ev in gen.run():
            if on_event is not None:
                on_event(ev)
        gen_s = time.perf_counter() - t1
        stats = gen.stats
        generated = sum(s.generated for s in req.sequences)
        return {
            "controller": str(wasm), "model": str(model or "smollm2"), "engine": engine, "prompt": prompt,
            "sequences": [{
                "label": s.label, "seq_id": s.seq_id, "parent": s.parent, "text": s.text,
                "tokens": s.output_tokens, "prompt_tokens_removed": len(req.prompt) - s.kept_prompt,
                "finish_reason": s.finish_reason, "error": s.error, "logs": "".join(s.logs),
            } for s in req.sequences],
            "variables": {k: _var_text(v) for k, v in req.variables.items()},
            "timing": {
                "model_load_s": load_s, "generate_s": gen_s, "tokens": generated,
                "tokens_per_s": generated / gen_s if gen_s > 0 else 0.0,
                **stats.as_dict(),
            },
        }


def _checked_runtime(wasm: Path, arg: bytes, prompt: str, model: str | None) -> Runtime | None:
    """A Runtime over the model's tokenizer on which the controller's first call did not fail,
    or None where the tokenizer alone is not cheap to get. Raises `RunFailed` if it failed."""
    from .arg_check import first_call_error, model_tokenizer
    from ..core.runtime import Runtime
    from ..host.tokenizer import ByteTokenizer

    tokenizer = model_tokenizer(model)
    # where the model's tokenizer is not cheap to get, the check runs over the byte tokenizer:
    # what a controller decides from its argument alone (a bad regex or schema) fails there too
    runtime = Runtime(tokenizer if tokenizer is not None else ByteTokenizer())
    try:
        failed = first_call_error(runtime, wasm, arg, prompt)
    except BaseException:
        runtime.close()
        raise
    if failed is not None or tokenizer is None:
        runtime.close()
    if failed is not None:
        error, log = failed
        raise RunFailed(failure_message(f"the controller failed on its first call, before the model loaded: {error}",
                                        log), log=log)
    return runtime if tokenizer is not None else None


def _summary(result: dict, out: IO[str], err: IO[str], printer: StreamPrinter) -> None:
    if not printer.at_line_start:
        out.write("\n")
    out.flush()
    style = printer._style
    for s in result["sequences"]:
        why = s["finish_reason"] + (f": {s['error']}" if s["error"] else "")
        err.write(style(f"#{s['label']}: {why} ({len(s['tokens'])} tokens)", dim=True) + "\n")
        if s["logs"] and not printer.show_logs and (s["error"] or not s["tokens"]):
            # A controller that ends with nothing to show usually logged why.
            for line in s["logs"].rstrip("\n").split("\n")[-5:]:
                err.write(style(f"  log: {line}", dim=True) + "\n")
    if result["variables"]:
        err.write("variables:\n")
        for name, value in result["variables"].items():
            text = value.rstrip("\n").replace("\n", "\n    ") if isinstance(value, str) else repr(value)
            err.write(f"  {name} = {text}\n")
    t = result["timing"]
    err.write(style(
        f"{t['tokens']} tokens in {t['generate_s']:.2f} s ({t['tokens_per_s']:.1f} tokens/s, {t['steps']} steps); "
        f"forward {t['forward_s']:.2f} s; controllers {t['controller_s'] * 1e3:.1f} ms, "
        f"engine waited {t['wait_s'] * 1e3:.1f} ms for them ({t['hidden_fraction'] * 100:.0f}% hidden); "
        f"model load {t['model_load_s']:.1f} s", dim=True) + "\n")
    err.flush()
