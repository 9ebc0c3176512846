"""kproxy: a transparent, protocol-decoding Kafka TCP proxy.

Packages, each knowing only the ones below it (the picture, and the path of a request's
bytes: docs/architecture.md):

- ``kproxy.protocol``: the sans-I/O codec. Bytes in, decoded requests, responses and
  connection events out; no sockets, no asyncio. Its schema is generated from Kafka's
  own message definitions (``tools/generate_schema.py``); ``api_keys.ApiKey`` names
  every API.
- ``kproxy.observers``: fed decoded events after the bytes are forwarded: ``metrics``
  (Prometheus), ``capture`` (JSONL, Parquet, pcapng), ``live`` (the live page's view),
  ``audit``; ``contract`` is what the proxy hands them (``ConnectionInfo``, lifecycle
  hooks, ``CloseCause``).
- ``kproxy.config`` (one frozen config, typed sections parsed once), ``kproxy.certs``
  (TLS files and SNI names it validates).
- ``kproxy.proxy``: the asyncio I/O layer, the only code that owns sockets. ``server``
  runs listeners and the broker directory, ``relay`` pumps one connection's bytes
  (forwarding first; ``memory``: its read arena and buffer budget), ``rewrite``
  replaces broker addresses in the responses that carry them.
- ``kproxy.probes``: /healthz and /readyz answered by a process of its own from a
  board each event loop posts to.
- ``kproxy.admin``: the HTTP faces on the admin listener: metrics, capture control,
  the live page (``web/``), and with workers the supervisor's merged views.
- ``kproxy.runtime`` (wiring, shutdown), ``kproxy.workers`` (``kproxy run --workers
  N``: a supervisor and N worker processes sharing the ports), ``kproxy.cli``
  (``kproxy run|capture|analyze|demo``; ``kproxy.startup_log``: the lines naming every
  listener once kproxy serves).
- ``kproxy.pipeline``: the PySpark analysis of captures (reads the capture schema,
  never the proxy); ``kproxy.embedded``: real brokers on loopback for the demo and tests.
"""

__version__ = "0.1.0"      # the one place: pyproject.toml reads it (setuptools dynamic version)

# The name to `pip install` (pyproject.toml's project name): `kproxy` on the package index
# is an unrelated project. Messages that tell a user what to install use this.
DISTRIBUTION = "kproxy-kafka"
