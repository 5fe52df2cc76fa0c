"""The routes of `aicirt serve`, one module a concern; `serve.app.create_app` mounts them.

- `service`: `GET /health`, `/metrics`, `/v1/config`, `/v1/models`
- `controllers`: the store: `POST|GET /v1/controllers`, `GET|POST /v1/controllers/tags`,
  `DELETE /v1/controllers/{name}`
- `aici`: AICI's `POST /v1/run`
- `openai`: OpenAI's `POST /v1/completions` and `/v1/chat/completions`

Every handler reaches the one `Server` through `request.app.state.server` (`common.server_of`),
never through module state, and never touches the engine: it validates, resolves the controller,
tokenizes (in a worker thread), hands a `Job` to the engine loop and streams what it posts back.
"""
from __future__ import annotations

from . import aici, controllers, openai, service

ROUTERS = (service.router, controllers.router, aici.router, openai.router)

#: The fixed routes, for the per-route response counter (`/v1/controllers/{name}` is matched apart).
PATHS = frozenset({"/v1/controllers", "/v1/controllers/tags", "/v1/run", "/v1/completions", "/v1/chat/completions",
                   "/v1/models", "/v1/config", "/health", "/metrics"})
