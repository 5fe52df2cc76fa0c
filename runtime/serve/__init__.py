"""Serving controllers: the controller store and `aicirt serve` (AICI's REST API and OpenAI's).

Layers, each importing only those before it:

- `store`: content-addressed modules, tags and metadata in SQLite (stdlib only; no server needed);
- `settings`: one schema for the server's options (CLI flags, environment, tests);
- `protocol`: request validation and the response/stream shapes (AICI's and OpenAI's);
- `loop`: the one engine thread every request shares (continuous batching, admission control);
- `metrics`: counters and Prometheus text;
- `app`: `create_app(settings)`, the ASGI application (FastAPI; imported only here);
- `client`, `commands`: what the CLI's `upload`/`tags`/`ls`/`rm`/`run --server` do.

Importing `aicirt.serve` (or `aicirt.serve.store`) imports no web framework.
"""
