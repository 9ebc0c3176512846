"""kproxy: a transparent, protocol-decoding Kafka TCP proxy.

Layers, each knowing only the ones below it:

- ``kproxy.protocol``: the sans-I/O codec. Bytes in, decoded requests,
  responses and connection events out; no sockets, no asyncio. Its schema is
  generated from Kafka's own message definitions (``tools/generate_schema.py``).
- ``kproxy.proxy``: the asyncio I/O layer, the only code that owns sockets.
  ``server`` runs listeners and the broker directory, ``relay`` pumps one
  connection's bytes (forwarding first), ``rewrite`` replaces broker
  addresses in the responses that carry them.
- ``kproxy.observers``: fed decoded events after the bytes are forwarded:
  ``metrics`` (Prometheus) and ``capture`` (JSONL, Parquet, pcapng).
- ``kproxy.config`` (one frozen config), ``kproxy.runtime`` (wiring, admin
  listener, probe process, shutdown; ``proxy.probes``: /healthz and /readyz
  answered by a process of their own from a board each event loop posts to),
  ``kproxy.workers`` (``kproxy run --workers N``: a supervisor and N worker
  processes sharing the ports; its admin listener, ``proxy.worker_admin``,
  merges theirs), ``kproxy.cli`` (``kproxy run|capture|analyze|demo``;
  ``kproxy.startup_log``: the lines naming every listener once kproxy serves),
  ``kproxy.embedded`` (real brokers on loopback for the demo and tests).
"""

__version__ = "0.1.0"      # the one place: pyproject.toml reads it (setuptools dynamic version)

# The name to `pip install` (pyproject.toml's project name): `kproxy` on the package index
# is an unrelated project. Messages that tell a user what to install use this.
DISTRIBUTION = "kproxy-kafka"
