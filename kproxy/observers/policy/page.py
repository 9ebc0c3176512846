"""The live page's policy section: the rules, and who breaks them (``GET /live/policy``)."""

from __future__ import annotations

# Violators listed at most (most requests first); the metric has them all.
PAGE_MAX_VIOLATORS = 200


def policy_page(observer) -> dict:
    """The JSON the page's policy panel shows."""
    rules = [{"name": r.name, "check": r.check, "enforce": r.enforce, "error": r.error,
              "refused": observer.refused.get(r.name, 0)} for r in observer.policy.rules]
    return {"configured": True, "file": observer.policy.source, "rules": rules,
            "violators": observer.snapshot()[:PAGE_MAX_VIOLATORS]}
