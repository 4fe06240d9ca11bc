"""`BackgroundServer`: an app served on a thread answers real HTTP, a taken port is a clear error
instead of a hang, and closing frees the port."""
from __future__ import annotations

import httpx
import pytest
from fastapi import FastAPI

from lwm_jax.sampling.background import BackgroundServer, free_port


def _app() -> FastAPI:
  app = FastAPI()

  @app.get("/ping")
  def ping():
    return {"pong": True}

  return app


def test_serves_and_closes():
  with BackgroundServer(_app()) as srv:
    assert httpx.get(srv.url + "/ping").json() == {"pong": True}
    with pytest.raises(RuntimeError, match=f"{srv.url} stopped while starting"):
      BackgroundServer(_app(), port=srv.port)
    # the failed second server did not disturb the first
    assert httpx.get(srv.url + "/ping").status_code == 200
  assert not srv.thread.is_alive()
  with pytest.raises(httpx.ConnectError):
    httpx.get(srv.url + "/ping")


def test_free_port_is_bindable():
  import socket  # pylint: disable=import-outside-toplevel
  with socket.socket() as s:
    s.bind(("127.0.0.1", free_port()))
