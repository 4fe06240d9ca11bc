"""Running an ASGI app (the OpenAI server, the simulated-environment server) on a thread of this
process: for notebooks, tests and benchmarks that want a real HTTP endpoint without a second
process. `launch/serve.py` and `launch/sim_serve.py` are the way to serve for real.

    with BackgroundServer(create_app(sampler, "lwm")) as srv:
      client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none")
"""
from __future__ import annotations

import socket
import threading
import time


def free_port(host: str = "127.0.0.1") -> int:
  """A TCP port that nothing listens on now (the OS picks it; another process could take it
  before it is used, which on a test machine does not happen in practice)."""
  with socket.socket() as s:
    s.bind((host, 0))
    return s.getsockname()[1]


class BackgroundServer:
  """Serves `app` with uvicorn on a daemon thread; returns once the server accepts connections.
  `url` is `http://HOST:PORT`; `close()` (or leaving the `with` block) stops it."""

  def __init__(self, app, host: str = "127.0.0.1", port: int | None = None,
               start_timeout_s: float = 30.0, log_level: str = "warning"):
    import uvicorn  # pylint: disable=import-outside-toplevel  (a serving dependency only)
    self.port = port or free_port(host)
    self.url = f"http://{host}:{self.port}"
    self.server = uvicorn.Server(uvicorn.Config(app, host=host, port=self.port,
                                                log_level=log_level))
    self.thread = threading.Thread(target=self._run, name="lwm-http", daemon=True)
    self.thread.start()
    deadline = time.monotonic() + start_timeout_s
    while not self.server.started:
      if not self.thread.is_alive():
        raise RuntimeError(f"the server on {self.url} stopped while starting (port taken?)")
      if time.monotonic() > deadline:
        self.close()
        raise RuntimeError(f"the server on {self.url} did not start within {start_timeout_s} s")
      time.sleep(0.05)

  def _run(self) -> None:
    try:
      self.server.run()
    except SystemExit:  # uvicorn exits when it cannot bind; __init__ reports it
      pass

  def close(self, timeout_s: float = 10.0) -> None:
    self.server.should_exit = True
    self.thread.join(timeout=timeout_s)

  def __enter__(self) -> "BackgroundServer":
    return self

  def __exit__(self, *exc) -> None:
    self.close()
