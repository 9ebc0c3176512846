"""Reading an operator's TOML or YAML file: kproxy's config and a policy rules file alike.

One reader, so both kinds of file take the same formats and name the same place (file,
line and column where the parser knows them) when they cannot be read.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any


class SettingsFileError(ValueError):
    """A file that cannot be read or parsed; the message names it (``<what> file <path>``)."""


def read_settings_file(path: str | Path, what: str) -> Any:
    """The parsed contents of ``path`` (.yaml/.yml as YAML, anything else as TOML)."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise SettingsFileError(f"{what} file {path}: {exc.strerror}") from None
    if path.suffix in (".yaml", ".yml"):
        import yaml
        try:
            return yaml.safe_load(text) or {}
        except yaml.MarkedYAMLError as exc:      # names its mark: line and column, from 0
            mark = exc.problem_mark or exc.context_mark
            where = f", line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            raise SettingsFileError(f"{what} file {path}{where}: {exc.problem or exc.context}") from None
        except yaml.YAMLError as exc:
            raise SettingsFileError(f"{what} file {path}: {exc}") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:       # its message ends "(at line L, column C)"
        raise SettingsFileError(f"{what} file {path}: {exc}") from None
