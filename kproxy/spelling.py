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


def check_table(data, known, key: str) -> None:
    """ValueError unless ``data`` is a mapping whose keys are all ``known`` (the first
    unknown one named, with a suggestion): the shape check of every settings sub-table."""
    from collections.abc import Mapping
    if not isinstance(data, Mapping):
        raise ValueError(f"{key}: expected a table/object")
    unknown = sorted(set(data) - set(known), key=str)
    if unknown:
        raise ValueError(f"{key}.{unknown[0]}: unknown setting{did_you_mean(str(unknown[0]), known)}")
