"""A server on a background thread of this process (tests, benchmarks, notebooks).

    with serve_in_thread(create_app(Settings(model="scripted"))) as url:
        httpx.get(url + "/health")

uvicorn on 127.0.0.1 and a free port (port 0 unless given); the context waits until it accepts
connections and, on exit, until it has shut down (the app's engine thread included).
"""
from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def serve_in_thread(app: Any, host: str = "127.0.0.1", port: int = 0, timeout_s: float = 60.0) -> Iterator[str]:
    import uvicorn

    config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on",
                            timeout_graceful_shutdown=5)
    server = uvicorn.Server(config)
    server.install_signal_handlers = lambda: None  # type: ignore[attr-defined]  # not the main thread
    thread = threading.Thread(target=server.run, name="aicirt-uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError("the server did not start (see its log above)")
        if time.monotonic() > deadline:
            server.should_exit = True
            raise TimeoutError(f"the server did not start within {timeout_s:g} s")
        time.sleep(0.02)
    bound = server.servers[0].sockets[0].getsockname()
    try:
        yield f"http://{host}:{bound[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout_s)
