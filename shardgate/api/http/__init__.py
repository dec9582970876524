"""The HTTP front door: operator console, ``/debug/`` JSON, ``/metrics``."""

from shardgate.api.http.server import HttpServer, make_app

__all__ = ["HttpServer", "make_app"]
