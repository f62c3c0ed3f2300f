"""The middleware under the frameworks the issue names beyond Starlette and Flask.

FastAPI installs the ASGI middleware its own way (``app.add_middleware``) under uvicorn;
Django serves the WSGI middleware under waitress. Both go through the same accept,
delay, reject and loginfo checks as the Starlette and Flask apps.
"""

from __future__ import annotations

from typing import Any

import django
from django.conf import settings
from django.core.handlers.wsgi import WSGIHandler
from django.http import HttpRequest, HttpResponse
from django.urls import re_path
from fastapi import FastAPI
from fastapi.responses import PlainTextResponse

from smockron.gatekeeper.asgi import SmockronMiddleware
from smockron.gatekeeper.wsgi import SmockronWSGIMiddleware
from tests.gatekeeper.conftest import MasterSockets
from tests.gatekeeper.servers import uvicorn_server, waitress_server
from tests.gatekeeper.test_http_middleware import _exercise, api_options


def _django_hello(request: HttpRequest, path: str) -> HttpResponse:
    return HttpResponse(f"hello /{path}", content_type="text/plain")


urlpatterns = [re_path(r"^(?P<path>.*)$", _django_hello)]  # this module is the ROOT_URLCONF


def django_app() -> WSGIHandler:
    if not settings.configured:
        settings.configure(
            DEBUG=False,
            SECRET_KEY="smockron-tests",
            ALLOWED_HOSTS=["*"],
            ROOT_URLCONF=__name__,
            MIDDLEWARE=[],
            INSTALLED_APPS=[],
        )
        django.setup()
    return WSGIHandler()


def fastapi_app(**smockron: Any) -> FastAPI:
    app = FastAPI()

    @app.get("/{path:path}")
    async def hello(path: str) -> PlainTextResponse:
        return PlainTextResponse(f"hello /{path}")

    app.add_middleware(SmockronMiddleware, **smockron)
    return app


def test_fastapi_under_uvicorn(master: MasterSockets) -> None:
    app = fastapi_app(**api_options(master))
    with uvicorn_server(app) as port:
        _exercise(master, port)


def test_django_under_waitress(master: MasterSockets) -> None:
    app = SmockronWSGIMiddleware(django_app(), **api_options(master))
    try:
        with waitress_server(app) as port:
            _exercise(master, port)
    finally:
        app.close()
