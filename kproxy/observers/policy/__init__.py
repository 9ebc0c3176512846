"""Policy rules judged live (dry run): every request against the rules file.

``PolicyObserver`` is fed the connection tracker's events like the other observers
(after the bytes are forwarded). For each request it looks up the rules for its API
(a dict lookup; most APIs have none but the connection-wide ones) and judges it with
``kproxy.policy``; violations are counted per rule and violator (client id and client
software, capped like the other labelled metrics) for ``kproxy_policy_violations_total``,
with the first request of each violator kept as an example for the live page.
Requests refused by enforced rules (``proxy/policy_answers``) reach it like any other, with
kproxy's answer; it counts them per rule for ``kproxy_policy_refused_total``.
"""

from .observer import PolicyObserver, Violator

__all__ = ["PolicyObserver", "Violator"]
