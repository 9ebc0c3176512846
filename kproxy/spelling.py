"""Suggestions for misspelt setting names, shared by config loading and the settings
tables it hands on (capture, filters); imports nothing of kproxy's."""

import difflib

# How close a misspelling must be to a known name for "did you mean" (difflib's ratio;
# 0.6 is its default, which also offers unrelated short names).
SUGGESTION_CUTOFF = 0.75


def did_you_mean(name: str, known) -> str:
    """`` (did you mean X?)`` for the known name closest to a misspelt one, else ``""``."""
    close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=SUGGESTION_CUTOFF)
    return f" (did you mean {close[0]}?)" if close else ""
