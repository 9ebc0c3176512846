"""Limits every kproxy HTTP listener holds its callers to: the admin listener (aiohttp)
and the probe process's own small server (``probe_server``), which must not import aiohttp.

Kept here, in a module that imports nothing, so both enforce the same numbers.
"""

READ_TIMEOUT_S = 5.0               # request headers (and any body) must arrive within this
MAX_HEADER_LINES = 100             # curl sends 3, Prometheus 5; a stream of headers is not a request
MAX_LINE_BYTES = 8190              # a request line or header longer than this is not from a probe
# Connections the kernel queues before kproxy accepts them. A burst beyond this (a
# scrape storm) makes the kernel drop SYNs, and every caller then, health checks
# included, waits for its SYN to be resent: 1 s, then 3 s.
LISTEN_BACKLOG = 1024
