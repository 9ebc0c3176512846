"""How /readyz is timed: the broker check (run by ``proxy.own_requests`` on the proxy's
loop) and the probe that waits for it (``probes``, in a process of its own) must agree,
so their timings stand here, in a module that imports nothing."""

# A broker check's answer is served this long without asking again: a probe storm costs
# the brokers nothing extra. The probe process asks for a fresh one once it is older.
READINESS_CACHE_S = 1.0
# The check asks an upstream for ApiVersions within this time.
READINESS_TIMEOUT_S = 2.0
# A /readyz whose answer expired waits this long for the proxy's loop to ask the broker:
# above READINESS_TIMEOUT_S, so a check that gives up is still reported, and below the
# shipped readiness probes' 3 s timeout, so they get an answer, not a timeout.
READY_WAIT_S = 2.5
