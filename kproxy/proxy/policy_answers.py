"""Enforced policy rules on one connection: the requests kproxy refuses, answering them itself.

Only when some rule says ``enforce = true`` does a connection get a ``PolicyAnswers``
(otherwise the relay's cost is nothing per request). It is one of the connection's
``local_requests.LocalAnswers``: the frames of APIs some enforced rule looks at are kept
back until whole and judged before any of their bytes is forwarded; a request that breaks
a rule is never forwarded, and kproxy answers it in the broker's place with the rule's
error (``policy.answers``), in its turn, as ``local_requests`` orders every local answer.

No I/O here; the relay owns the sockets.
"""

from __future__ import annotations

from collections import deque

from ..policy import Policy, Subject, refusal_answer
from ..policy.answers import NEVER_REFUSED
from ..protocol.api_keys import ApiKey
from ..protocol.client_software import FIRST_NAMING_VERSION
from ..protocol.events import RequestReceived
from ..protocol.pair_fields import pair_fields

_API_VERSIONS = int(ApiKey.API_VERSIONS)   # a plain int: compared per request


class PolicyAnswers:
    """One connection's enforcement (``LocalAnswers``): which requests are refused, and
    their answers. ``counts``: rule -> requests refused, shared by the process."""

    def __init__(self, policy: Policy, counts: dict[str, int]):
        self.policy = policy
        self.counts = counts
        self._software: tuple[str | None, str | None] = (None, None)
        self._answers: deque[bytes] = deque()     # refusals owed an answer, in request order
        # API keys some enforced rule looks at (None: every API)
        enforced = [r.apis for r in policy.rules if r.enforce]
        self._keys = None if any(a is None for a in enforced) else frozenset().union(*enforced)

    def answers(self, api_key: int) -> bool:
        """APIs an enforced rule judges; and ApiVersions, whose software name the rules read."""
        keys = self._keys
        return keys is None or api_key in keys or api_key == _API_VERSIONS

    def takes(self, info, request: RequestReceived) -> bool:
        """Whether ``request`` breaks an enforced rule (and its answer has a place for the error)."""
        api_key = request.api_key
        if api_key in NEVER_REFUSED:
            if api_key == _API_VERSIONS and request.api_version >= FIRST_NAMING_VERSION:
                self._learn_software(request)
            return False
        keys = self._keys
        if keys is not None and api_key not in keys:
            return False
        decoded = request.request
        if decoded is None or decoded.is_opaque:
            return False                      # the broker judges what kproxy cannot read
        subject = Subject(api_key, request.api_version, decoded.client_id, self._software, decoded.body)
        violation = self.policy.enforced(subject)
        if violation is None:
            return False
        rule = violation.rule
        answer = refusal_answer(decoded, rule.error_code,
                                f"refused by kproxy policy rule {rule.name}: {violation.reason}")
        if answer is None:
            return False                      # no place for an error in its answer: let it pass
        self.counts[rule.name] = self.counts.get(rule.name, 0) + 1
        if request.expects_response:          # acks=0: refused without an answer
            self._answers.append(answer)
        return True

    def answer(self, info, request: RequestReceived) -> bytes:
        return self._answers.popleft()        # asked in request order, as they were taken

    def _learn_software(self, request: RequestReceived) -> None:
        """The software an ApiVersions v3+ names (the latest counts, as for the broker)."""
        decoded = request.request
        if decoded is not None and not decoded.is_opaque:
            fields = pair_fields(_API_VERSIONS, decoded.body, None)
            self._software = (fields["client_software_name"], fields["client_software_version"])
