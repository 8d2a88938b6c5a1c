"""GET /docs: Swagger UI served from this server, so it works without internet.

FastAPI's own /docs loads Swagger UI's JavaScript and CSS from a CDN and its favicon from
FastAPI's site: on a machine without internet (or behind a strict proxy) the page stays blank.
Here the same page (FastAPI's `get_swagger_ui_html`) points at Swagger UI's dist files as the
`swagger-ui-bundle-v2` package installs them (Swagger UI 5, which renders OpenAPI 3.1 as FastAPI
writes it). Only the three files the page loads are served, by name: no directory listing, no
source maps. The online validator badge (an image from swagger.io) is turned off. ReDoc is not
offered: no installed package ships it (the app is created with `redoc_url=None`).
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI, HTTPException, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse

from harness_env.core.errors import ToolMissingError

DOCS_PATH = "/docs"
ASSETS_PATH = DOCS_PATH + "/assets"
ASSETS = {  # URL name -> (file in Swagger UI's dist, media type)
    "swagger-ui-bundle.js": ("swagger-ui-bundle.js", "text/javascript; charset=utf-8"),
    "swagger-ui.css": ("swagger-ui.css", "text/css; charset=utf-8"),
    "favicon.png": ("favicon-32x32.png", "image/png"),
}
CACHE = "public, max-age=86400"  # the files change only with the installed package


def swagger_ui_dir() -> Path:
    """Swagger UI's dist directory, from the installed package; ToolMissingError (the app answers
    501 with this message) when the package or one of the files the page loads is missing."""
    try:
        from swagger_ui_bundle import swagger_ui_path
    except ImportError:
        raise ToolMissingError("/docs needs Swagger UI's files: install the server extra (pip install 'harness-env[server]')") from None
    dist = Path(str(swagger_ui_path))
    missing = [f for f, _ in ASSETS.values() if not (dist / f).is_file()]
    if missing:
        raise ToolMissingError(f"Swagger UI's files are missing from {dist}: {', '.join(missing)}; reinstall swagger-ui-bundle-v2")
    return dist


def add_docs_routes(app: FastAPI, title: str) -> None:
    """GET /docs and its assets. `app` must be created with docs_url=None (and redoc_url=None).
    A missing Swagger UI makes /docs answer 501 saying what to install; the server still serves."""

    @app.get(DOCS_PATH, include_in_schema=False)
    async def docs(request: Request) -> HTMLResponse:
        swagger_ui_dir()  # a clear 501 instead of a page whose scripts all fail
        root = request.scope.get("root_path", "").rstrip("/")  # behind a proxy that strips a prefix
        return get_swagger_ui_html(
            openapi_url=root + (app.openapi_url or "/openapi.json"),
            title=f"{title} - API",
            swagger_js_url=f"{root}{ASSETS_PATH}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{ASSETS_PATH}/swagger-ui.css",
            swagger_favicon_url=f"{root}{ASSETS_PATH}/favicon.png",
            oauth2_redirect_url=None,
            swagger_ui_parameters={"validatorUrl": None},
        )

    @app.get(ASSETS_PATH + "/{name}", include_in_schema=False)
    async def asset(name: str) -> FileResponse:
        if name not in ASSETS:
            raise HTTPException(404, f"no such asset; the page loads {', '.join(sorted(ASSETS))}")
        file, media_type = ASSETS[name]
        return FileResponse(swagger_ui_dir() / file, media_type=media_type, headers={"Cache-Control": CACHE})
