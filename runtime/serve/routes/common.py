"""What every route needs: the server, the API-key check, a size-limited body, the uploading user."""
from __future__ import annotations

import hmac
from typing import TYPE_CHECKING

from fastapi import Depends, Request

from .. import protocol as P
from ..store import default_user

if TYPE_CHECKING:
    from ..server import Server


def server_of(request: Request) -> Server:
    """The application's one `Server` (set by `create_app`)."""
    return request.app.state.server


def auth(request: Request) -> None:
    """Refuse with 401 unless the request carries the configured API key (none configured: open)."""
    key = server_of(request).settings.api_key
    if not key:
        return
    given = request.headers.get("api-key") or ""
    bearer = request.headers.get("authorization") or ""
    if bearer.lower().startswith("bearer "):
        given = given or bearer[7:].strip()
    if not hmac.compare_digest(given.encode(), key.encode()):
        raise P.ApiError(401, "missing or wrong API key (header `api-key: KEY` or `Authorization: Bearer KEY`)")


#: `dependencies=` of every route but `/health`.
GUARDED = [Depends(auth)]


async def read_body(request: Request, limit: int) -> bytes:
    """The body, refused with 413 past `limit` bytes (before reading it all when the length is declared)."""
    declared = request.headers.get("content-length")
    # isascii: str.isdigit() also holds for '²' (Latin-1 0xB2), which int() refuses
    if declared is not None and declared.isascii() and declared.isdigit() and int(declared) > limit:
        raise P.ApiError(413, f"body of {declared} bytes is over the limit of {limit}")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise P.ApiError(413, f"body is over the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def user_of(request: Request) -> str:
    """Who to record as having uploaded or tagged: the client's `x-aicirt-user`, else the server's user."""
    name = request.headers.get("x-aicirt-user", "").strip()
    if name and len(name) <= 64 and name.isprintable():
        return name
    return default_user()
