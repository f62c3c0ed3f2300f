"""Real HTTP servers in threads: uvicorn for ASGI apps, waitress for WSGI apps."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import uvicorn
import waitress

from tests.support import free_port, wait_port


@contextlib.contextmanager
def uvicorn_server(app: Any) -> Iterator[int]:
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_port(port)
        yield port
    finally:
        server.should_exit = True
        thread.join(10)


@contextlib.contextmanager
def waitress_server(app: Any, threads: int = 8) -> Iterator[int]:
    port = free_port()
    server = waitress.create_server(app, host="127.0.0.1", port=port, threads=threads)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_port(port)
        yield port
    finally:
        # close every socket from the loop's own thread (closing them from here races
        # the loop's select() and makes it fail on a closed descriptor); an empty map
        # ends the loop
        def close_all() -> None:
            for channel in list(server._map.values()):
                channel.close()

        server.trigger.pull_trigger(close_all)
        thread.join(10)
        server.task_dispatcher.shutdown()
