"""kproxy's HTTP faces, served on its admin listener (aiohttp, on the proxy's event loop).

- ``admin``: the listener itself: routes, bearer-token protection, /metrics rendered
  off the loop (``SharedRender``), /healthz and /readyz when no probe process answers.
- ``live_web``: the live page (``web/``: HTML, JS, CSS) and its event stream, fed by
  ``observers.live``.
- ``worker_admin`` and ``live_merge``: the supervisor's admin listener with
  ``kproxy run --workers N``: metrics summed, captures and the live page merged from
  every worker's private admin listener.

The limits every kproxy HTTP listener holds callers to are ``kproxy.http_limits``, below
this package: the probe process, which must not import aiohttp, shares them.

Nothing here touches a Kafka connection: these faces read observers and the runtime.
"""
