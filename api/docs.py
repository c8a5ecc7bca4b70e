"""`/docs`: Swagger UI, every file of it served by the API itself.

FastAPI's own `/docs` page loads Swagger UI from a CDN, so on a machine without internet
access (ours reach only package registries) it is a blank page, and elsewhere it tells a
third party who reads our docs. The assets come from the `swagger-ui-bundle-v2` package
(Swagger UI 5, which reads OpenAPI 3.1; the older `swagger-ui-bundle` ships 4.15, which cannot)
and are served from `/docs/assets/`. The page is FastAPI's, pointed at them. ReDoc is not
served: no package ships it for Python apart from wrappers of FastAPI itself.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse
from starlette.staticfiles import StaticFiles
from swagger_ui_bundle import swagger_ui_path

DOCS_PATH = "/docs"
ASSETS_PATH = "/docs/assets"


def install(app: FastAPI) -> None:
    """Add `/docs` and its assets; the app must be built with `docs_url=None`."""
    app.mount(ASSETS_PATH, StaticFiles(directory=str(swagger_ui_path)), name="swagger-ui")

    @app.get(DOCS_PATH, include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        # Behind a proxy that mounts the API under a prefix, every URL needs that prefix.
        root = request.scope.get("root_path", "").rstrip("/")
        assets = root + ASSETS_PATH
        return get_swagger_ui_html(
            openapi_url=root + (app.openapi_url or "/openapi.json"),
            title=f"{app.title} API",
            swagger_js_url=f"{assets}/swagger-ui-bundle.js",
            swagger_css_url=f"{assets}/swagger-ui.css",
            swagger_favicon_url=f"{assets}/favicon-32x32.png",
            # Swagger UI would otherwise send the document to validator.swagger.io.
            swagger_ui_parameters={"validatorUrl": None},
        )
