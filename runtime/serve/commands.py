"""What the CLI's store and server commands do: `upload`, `tags`, `ls`, `rm`, `serve`, `run --server`.

cli.py only parses options. Each store command takes a target, the local `Store` or a
server's `RemoteStore` (`open_target`), and prints the same lines for either.
"""
from __future__ import annotations

import json
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import IO, Any

from .client import Client, RemoteStore
from .settings import Settings
from .store import ModuleInfo, Store, TagInfo, Upload

#: AICI's finish reasons (what /v1/run streams) back to the engine's, which the CLI prints.
_ENGINE_FINISH = {"aici-stop": "stop", "eos": "eos", "length": "length", "fail": "error", "abort": "abort"}


def open_target(server: str | None, api_key: str | None, store_dir: str | None) -> Store | RemoteStore:
    """The store a command works on: a server's (with `server`), else the local one."""
    if server:
        return RemoteStore(Client(server, api_key))
    return Store(store_dir)


def _when(ts: int) -> str:
    return datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")


def _size(n: int) -> str:
    return f"{n / 1024:.1f} KiB" if n < 1 << 20 else f"{n / (1 << 20):.2f} MiB"


def format_upload(up: Upload) -> list[str]:
    lines = [f"{up.module_id}  {_size(up.wasm_size)} -> {_size(up.compiled_size)} compiled in {up.time} ms"]
    lines += [f"  tag {t.tag} -> {t.module_id[:12]}" for t in up.tags]
    return lines


def format_tags(tags: list[TagInfo]) -> list[str]:
    if not tags:
        return ["no tags"]
    width = max(len(t.tag) for t in tags)
    return [f"{t.tag:<{width}}  {t.module_id[:12]}  {_size(t.wasm_size):>10}  {_when(t.updated_at)}  by {t.updated_by}"
            for t in tags]


def format_modules(mods: list[ModuleInfo]) -> list[str]:
    if not mods:
        return ["no modules"]
    return [f"{m.module_id}  {_size(m.wasm_size):>10}  {_size(m.compiled_size):>10}  {_when(m.created_at)}  "
            f"by {m.created_by}  {' '.join(m.tags) or '-'}" for m in mods]


def format_removed(gone: ModuleInfo | TagInfo) -> str:
    if isinstance(gone, TagInfo):
        return f"removed tag {gone.tag} (module {gone.module_id[:12]} kept)"
    also = f" and its tags {', '.join(gone.tags)}" if gone.tags else ""
    return f"removed module {gone.module_id}{also}"


def module_bytes(src: str, progress: bool = True) -> bytes:
    """A `.wasm` file's bytes, or those of a C/Zig file, folder or shipped name, built first."""
    from aicirt.runner.run import resolve_controller

    return Path(resolve_controller(src, progress=progress)).read_bytes()


def upload(target: Store | RemoteStore, src: str, tags: list[str]) -> Upload:
    """`aicirt upload`: build `src` if it is a source, then store it (locally or on a server)."""
    return target.put(module_bytes(src), tags=tags)


# --- run against a server -------------------------------------------------------------------------
class RemotePrinter:
    """Streams a `/v1/run` like `aicirt run` streams a local one: forks labelled `[#N]`, text a
    controller took back shown as `[⌫text]` (struck through in colour)."""

    def __init__(self, out: IO[str], err: IO[str], show_logs: bool, color: bool):
        self.out, self.err, self.show_logs, self.color = out, err, show_logs, color
        self.texts: dict[int, str] = {}
        self.last: int | None = None
        self.at_line_start = True

    def _write(self, text: str) -> None:
        if text:
            self.out.write(text)
            self.out.flush()
            self.at_line_start = text.endswith("\n")

    def _style(self, text: str, **kw: Any) -> str:
        import click

        return click.style(text, **kw) if self.color else text

    def on_fork(self, f: dict, forks_seen: int) -> None:
        idx = f["index"]
        text = self.texts.setdefault(idx, "")
        if forks_seen > 1 and self.last != idx:
            if not self.at_line_start:
                self._write("\n")
            self._write(self._style(f"[#{idx}] ", fg="cyan"))
        self.last = idx
        back = f.get("backtrack", 0)
        if back:
            removed = text[len(text) - back:]
            self._write(self._style(removed, fg="red", strikethrough=True) if self.color else f"[⌫{removed}]")
            text = text[:len(text) - back]
        self._write(f["text"])
        self.texts[idx] = text + f["text"]
        if f.get("logs") and self.show_logs:
            for line in f["logs"].rstrip("\n").split("\n"):
                self.err.write(self._style(f"[#{idx} log] {line}", dim=True) + "\n")
            self.err.flush()


def run_remote(client: Client, controller: str, *, arg: bytes, prompt: str, max_tokens: int, temperature: float,
               top_p: float, top_k: int, seed: int | None, chat: bool, as_json: bool, show_logs: bool,
               out: IO[str] | None = None, err: IO[str] | None = None) -> dict:
    """`aicirt run --server URL`: a local path or source is uploaded first; a tag, module id or
    shipped name is sent as is. Returns (and with `as_json` prints) the result. Raises
    `ServerError` when the server refuses the request (a controller that fails or refuses its
    argument on its first call is a 400 whose message leads with the controller's reason) and
    `aicirt.runner.run.RunFailed` after printing a result in which a sequence failed."""
    out, err = out or sys.stdout, err or sys.stderr
    name = controller
    if Path(controller).exists():
        name = RemoteStore(client).put(module_bytes(controller)).module_id
    try:
        arg_value = arg.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("a controller argument sent to a server must be UTF-8 text") from None
    payload = {"controller": name, "controller_arg": arg_value, "prompt": prompt, "max_tokens": max_tokens,
               "temperature": temperature, "top_p": top_p, "top_k": top_k, "chat": chat}
    if seed is not None:
        payload["seed"] = seed
    color = out.isatty() and not as_json
    printer = RemotePrinter(out, err, show_logs and not as_json, color)
    forks: dict[int, dict] = {}
    variables: dict[str, bytes] = {}
    usage: dict = {}
    model = None
    t0 = time.perf_counter()
    for obj in client.run_stream(payload):
        if obj.get("object") == "initial-run":
            model = obj.get("model")
            continue
        usage = obj.get("usage", usage)
        for f in obj.get("forks", []):
            seq = forks.setdefault(f["index"], {"label": f["index"], "text": "", "finish_reason": None,
                                                "error": None, "logs": ""})
            if not as_json:
                printer.on_fork(f, len(forks))
            back = f.get("backtrack", 0)
            seq["text"] = seq["text"][:len(seq["text"]) - back] + f["text"] if back else seq["text"] + f["text"]
            seq["logs"] += f.get("logs", "")
            if f.get("error"):
                seq["error"] = f["error"]
            if f.get("finish_reason"):
                seq["finish_reason"] = _ENGINE_FINISH.get(f["finish_reason"], f["finish_reason"])
            for s in f.get("storage", []):
                w = s.get("WriteVar")
                if w:
                    value = bytes.fromhex(w["value"])
                    variables[w["name"]] = (variables.get(w["name"], b"") + value if w["op"] == "Append" else value)
    gen_s = time.perf_counter() - t0
    from aicirt.runner.run import RunFailed, _var_text, failure

    tokens = usage.get("sampled_tokens", 0)
    result: dict[str, Any] = {
        "controller": name, "model": model, "prompt": prompt, "server": client.url,
        "sequences": [forks[k] for k in sorted(forks)],
        "variables": {k: _var_text(v) for k, v in variables.items()},
        "timing": {"generate_s": gen_s, "tokens": tokens, "tokens_per_s": tokens / gen_s if gen_s > 0 else 0.0,
                   "usage": usage},
    }
    if as_json:
        out.write(json.dumps(result, indent=2) + "\n")
    else:
        if not printer.at_line_start:
            out.write("\n")
        out.flush()
        for s in result["sequences"]:
            why = (s["finish_reason"] or "?") + (f": {s['error']}" if s["error"] else "")
            err.write(f"#{s['label']}: {why}\n")
        if result["variables"]:
            err.write("variables:\n")
            for k, v in result["variables"].items():
                text = v.rstrip("\n").replace("\n", "\n    ") if isinstance(v, str) else repr(v)
                err.write(f"  {k} = {text}\n")
        err.write(f"{tokens} tokens sampled in {gen_s:.2f} s on {client.url}\n")
        err.flush()
    why = failure(result)
    if why is not None:            # as `aicirt run` locally: the result first, then the failure
        raise RunFailed(why, result)
    return result


# --- serve ----------------------------------------------------------------------------------------
def serve(settings: Settings, *, log: IO[str] | None = None) -> None:
    """`aicirt serve`: load the model, then serve until interrupted. Raises
    `aicirt.MissingExtraError` without the `serve` extra."""
    try:
        import uvicorn

        from .app import create_app
    except ImportError as e:
        from aicirt import MissingExtraError

        raise MissingExtraError("aicirt serve needs FastAPI and uvicorn", "pip install 'aicirt[serve]'",
                                str(e)) from None

    log = log or sys.stderr
    log.write(f"aicirt serve: loading {settings.served_model} ...\n")
    log.flush()
    app = create_app(settings)
    server = app.state.server
    log.write(f"aicirt serve: store {server.store.root}; context {server.context} tokens; "
              f"listening on http://{settings.host}:{settings.port}"
              f"{' (API key required)' if settings.api_key else ''}; settings and limits: GET /v1/config\n")
    log.flush()
    uvicorn.run(app, host=settings.host, port=settings.port, log_level="warning", timeout_graceful_shutdown=5)
