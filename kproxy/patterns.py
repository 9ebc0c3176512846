"""Operators' regular expressions, run against names clients choose.

Capture filters (``client_id_regex``) and policy rules (client ids, topic and group names)
match an operator's pattern on the event loop, per request, against text any client picks.
RE2 (``google-re2``) runs in time linear in text x pattern, so no pattern and no client
id can stall the proxy; patterns RE2 cannot run that way (backreferences, lookaround) are
refused, and so is a pattern too large to run on every request. One place for both users,
so the bound and the wording are the same wherever an operator writes a pattern.
"""

from __future__ import annotations

from typing import Any, Callable

import re2

# Patterns look at most this many characters of a name (the rest is not looked at). A
# client chooses its client_id (up to 32,767 bytes on the wire) and every request carries
# it; real names are far shorter (Java's "producer-1", librdkafka's "rdkafka", Kafka
# Streams' "<application.id>-<uuid>-StreamThread-1-consumer").
MATCHED_CHARS = 256
# The largest compiled pattern (RE2's program size, ~ one instruction per character class
# or literal; repetition counts multiply it). "billing-.*" is 20 and "[a-q][^u-z]{13}x" 110;
# "(.{0,50}){20}z" is 9,045 and takes 16 ms per 256-character client_id (measured): a
# pattern past this bound is a mistake or an attack, not a filter or a naming rule.
MAX_PROGRAM_SIZE = 500
_OPTIONS = re2.Options()
_OPTIONS.log_errors = False               # refusals are reported to the operator, not stderr


class PatternError(ValueError):
    """A pattern RE2 cannot run in linear time, or too large; the message says why."""


def compile_pattern(pattern: str) -> Callable[[str], Any]:
    """``pattern`` as RE2's ``search`` (not anchored); PatternError says what is wrong."""
    try:
        compiled = re2.compile(pattern, _OPTIONS)
    except re2.error as exc:
        reason = exc.args[0] if exc.args else "invalid"
        if isinstance(reason, bytes):
            reason = reason.decode("utf-8", "replace")
        raise PatternError(f"{reason} (patterns are RE2 syntax, matched in linear time: "
                           f"no backreferences or lookaround; \\z for the end of text)") from None
    if compiled.programsize > MAX_PROGRAM_SIZE:
        raise PatternError(f"too large to run on every request (RE2 program size "
                           f"{compiled.programsize}, at most {MAX_PROGRAM_SIZE}); use a simpler pattern")
    return compiled.search
