"""/healthz and /readyz answered by a process of its own.

Each proxy event loop posts its heartbeat and readiness to a shared-memory board
(``probe_board``); ``probes`` holds the answers' rules, the heartbeat that posts and
``ProbeProcess``, which runs ``probe_server`` (a small HTTP server without aiohttp) in a
child process, so a probe is answered even while a loop is busy or stalled.
"""
