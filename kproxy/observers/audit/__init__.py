"""The audit trail: who changed what in the cluster, from where, and what the broker said.

An observer (``Audit``) fed the connection tracker's events. Every request that
changes cluster state (``events.AUDITED_APIS``, and OffsetCommit from outside a
group: an offset reset) becomes one JSON event: time, proxy instance, principal,
client address, client id and software, API and version, the decoded request
(secrets redacted by capture's rules) and the broker's answer per resource.
Events go to a rotating JSON Lines file and/or one INFO line each on the
``kproxy.audit`` logger, and are counted in ``kproxy_audit_events_total``.

- ``events.py``: what is audited, and the event made from a pair (no I/O).
- ``observer.py``: the event-loop hook (a set lookup per pair) and the writer thread.
- ``config.py``: the ``audit`` settings.
"""

from .config import AuditConfig
from .events import AUDITED_API_NAMES, AUDITED_APIS, OUTCOMES, build_event
from .observer import Audit

__all__ = ["AUDITED_API_NAMES", "AUDITED_APIS", "Audit", "AuditConfig", "OUTCOMES", "build_event"]
