"""How the app's errors answer: bad arguments 422, a component the server lacks (e.g. the Harbor
extra) 501, a full queue 429. No error answer echoes the request."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from harness_env.core.errors import InvalidRequestError, ToolMissingError, safe_text
from harness_env.server.slots import ServerBusy

MAX_DETAIL_CHARS = 20_000
STATUS_OF: dict[type[Exception], int] = {InvalidRequestError: 422, ToolMissingError: 501, ServerBusy: 429}


def validation_problem(err: dict) -> dict:
    """One of FastAPI's validation errors without its `input`, `ctx` and `url`, in JSON-safe text."""
    return {
        "type": err.get("type", ""),
        "loc": [x if isinstance(x, int) else safe_text(str(x), 200) for x in err.get("loc", ())],
        "msg": safe_text(str(err.get("msg", "")), 2000),
    }


async def _unvalidated(_r: Request, e: Exception) -> JSONResponse:
    # FastAPI's own answer echoes each bad `input` (up to the whole body; NaN or a lone
    # surrogate, which JSON cannot carry, made it a 500): where and what only.
    assert isinstance(e, RequestValidationError)
    return JSONResponse({"detail": [validation_problem(err) for err in e.errors()]}, status_code=422)


def add_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, _unvalidated)
    for error, status in STATUS_OF.items():

        async def answer(_r: Request, e: Exception, status: int = status) -> JSONResponse:
            return JSONResponse({"detail": safe_text(str(e), MAX_DETAIL_CHARS)}, status_code=status)

        app.add_exception_handler(error, answer)
