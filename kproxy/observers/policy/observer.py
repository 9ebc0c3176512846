"""The live policy observer: rules judged on every request, violators counted and kept."""

from __future__ import annotations

import time
from dataclasses import dataclass

from ...policy import Policy, Subject
from ...protocol import api_name
from ...protocol.client_software import software_named
from ...protocol.events import RequestReceived, ResponseReceived
from ...protocol.api_keys import ApiKey

OTHER = "other"          # the violator label past the cap (as BoundedLabel says it)
# Connections whose client software is remembered at most (a close forgets one; this
# bounds what a missing close hook could leave behind).
MAX_CONNECTIONS_TRACKED = 100_000


@dataclass
class Violator:
    """One (rule, client id, client software) seen breaking a rule, with its first request."""
    rule: str
    client_id: str
    client_software: str
    count: int
    first_time: float                  # wall clock
    client_address: str
    api: str
    api_version: int
    reason: str
    enforced: bool                     # the rule is enforced: these requests were refused

    def as_json(self) -> dict:
        return {"rule": self.rule, "client_id": self.client_id, "client_software": self.client_software,
                "count": self.count, "first_time": self.first_time,
                "example": {"client_address": self.client_address, "api": self.api,
                            "api_version": self.api_version, "reason": self.reason},
                "enforced": self.enforced}


class PolicyObserver:
    """Judges every request against ``policy``; ``violators`` and ``refused`` are read by the
    metrics and the live page (the event loop is their only writer)."""

    def __init__(self, policy: Policy, label_cap: int):
        self.policy = policy
        self.label_cap = label_cap
        self.violators: dict[tuple[str, str, str], Violator] = {}
        self.refused: dict[str, int] = {r.name: 0 for r in policy.rules if r.enforce}
        self._distinct: set[tuple[str, str]] = set()       # violators labelled so far
        self._software: dict[int, tuple[str | None, str | None]] = {}
        self._wall_offset = time.time() - time.monotonic()

    def __call__(self, info, events) -> None:
        """Requests are judged with their answer (those that get none: when sent), the
        connection's software as of that pair, as a capture row has it: the same judgement
        as ``kproxy analyze`` makes of the capture."""
        rules_for = self.policy.rules_for
        for event in events:
            cls = event.__class__
            if cls is ResponseReceived:
                request = event.request_event
                if request.api_key == ApiKey.API_VERSIONS:
                    software = software_named(event)
                    if software is not None:
                        if len(self._software) >= MAX_CONNECTIONS_TRACKED:
                            self._software.clear()
                        self._software[info.id] = (software.name, software.version)
                if rules_for(request.api_key):
                    self._judge(info, request)
            elif cls is RequestReceived and not event.expects_response and rules_for(event.api_key):
                self._judge(info, event)

    def connection_closed(self, info, reason=None, in_flight=None) -> None:
        if info is not None:
            self._software.pop(info.id, None)

    def _judge(self, info, event) -> None:
        request = event.partial                    # Produce, Fetch: the fields rules read
        body = None if request is None or request.is_opaque else request.body
        client_id = request.client_id if request is not None else None
        software = self._software.get(info.id, (None, None))
        subject = Subject(event.api_key, event.api_version, client_id, software, body)
        for violation in self.policy.violations(subject):
            self._count(info, event, software, client_id, violation)

    def _count(self, info, event, software, client_id, violation) -> None:
        name = software[0] or ""
        label = (client_id or "", f"{name} {software[1]}" if name else "")
        if label not in self._distinct:
            if len(self._distinct) < self.label_cap:
                self._distinct.add(label)
            else:
                label = (OTHER, OTHER)
        rule = violation.rule
        key = (rule.name, *label)
        found = self.violators.get(key)
        if found is not None:
            found.count += 1
            return
        self.violators[key] = Violator(
            rule.name, label[0], label[1], 1, event.time + self._wall_offset,
            f"{info.client[0]}:{info.client[1]}", api_name(event.api_key), event.api_version,
            violation.reason, rule.enforce)

    def snapshot(self) -> list[dict]:
        """Violators, most violations first (for the live page)."""
        found = sorted(self.violators.values(), key=lambda v: -v.count)
        return [v.as_json() for v in found]
