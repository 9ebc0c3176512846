"""The rules file, parsed once into a ``Policy`` (the checks it may name: ``checks.py``).

A rules file (TOML or YAML) is a table ``rules`` of named rules; each names its
``check`` (one of ``CHECKS``), the check's options, and ``enforce`` (default false:
dry run, violations are only counted)::

    [rules.producers-ack-all]
    check = "acks_all"
    enforce = true

    [rules.named-clients]
    check = "client_id"
    pattern = "^[a-z]+-[a-z0-9-]+$"

A rule's name labels its violations everywhere (metric, live page, analyze table).
A bad file raises ``PolicyError`` naming the file, the rule and the key.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from ..protocol import API_KEYS
from ..settings_file import SettingsFileError, read_settings_file
from .checks import CHECKS, ERROR_CODES, Check, PolicyError, option_error
from .subject import Subject

RULE_KEYS = ("check", "enforce", "error")


@dataclass(frozen=True)
class Rule:
    name: str
    check: str
    enforce: bool
    error: str              # the error name kproxy answers with when it enforces the rule (``error`` key)
    test: Check = field(compare=False, repr=False)

    @property
    def apis(self) -> frozenset[int] | None:
        return self.test.APIS

    @property
    def error_code(self) -> int:
        return ERROR_CODES[self.error]


@dataclass(frozen=True, slots=True)
class Violation:
    rule: Rule
    reason: str


@dataclass(frozen=True)
class Policy:
    """The rules of one file. ``violations(subject)`` judges one request."""
    rules: tuple[Rule, ...]
    source: str = ""
    # The file's content as read: what ``parse_policy`` makes this Policy from again where
    # it cannot be sent (Spark executors; compiled patterns do not pickle).
    data: Any = field(default=None, compare=False, repr=False)
    _by_api: dict = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self):
        every = tuple(r for r in self.rules if r.apis is None)
        for key in API_KEYS.values():
            found = tuple(r for r in self.rules if r.apis is None or key in r.apis)
            if found != every:
                self._by_api[key] = found
        self._by_api[None] = every

    @property
    def enforcing(self) -> bool:
        return any(rule.enforce for rule in self.rules)

    def rules_for(self, api_key: int) -> tuple[Rule, ...]:
        by_api = self._by_api
        found = by_api.get(api_key)
        return by_api[None] if found is None else found

    def violations(self, subject: Subject) -> list[Violation]:
        out = []
        for rule in self.rules_for(subject.api_key):
            reason = rule.test(subject)
            if reason is not None:
                out.append(Violation(rule, reason))
        return out

    def enforced(self, subject: Subject) -> Violation | None:
        """The first enforced rule the request breaks, or None."""
        for rule in self.rules_for(subject.api_key):
            if rule.enforce:
                reason = rule.test(subject)
                if reason is not None:
                    return Violation(rule, reason)
        return None


def parse_policy(data: Any, source: str) -> Policy:
    """A rules file's content (a dict from TOML/YAML) as a Policy; PolicyError names what is wrong."""
    where = f"policy file {source}"
    if not isinstance(data, Mapping) or set(data) - {"rules"}:
        unknown = sorted(set(data) - {"rules"}) if isinstance(data, Mapping) else []
        raise option_error(where, f"{unknown[0]}: unknown key (the file holds a table 'rules')" if unknown
                    else "expected a table 'rules' of named rules")
    table = data.get("rules")
    if not isinstance(table, Mapping) or not table:
        raise option_error(where, "rules: expected a table of named rules (none given)")
    rules = []
    for name, options in table.items():
        at = f"{where}: rules.{name}"
        if not isinstance(options, Mapping):
            raise option_error(at, "expected a table with 'check' and its options")
        kind = options.get("check")
        if kind not in CHECKS:
            raise option_error(f"{at}.check", f"expected one of {', '.join(CHECKS)}, got {kind!r}")
        cls = CHECKS[kind]
        unknown = set(options) - set(RULE_KEYS) - set(cls.OPTIONS)
        if unknown:
            raise option_error(f"{at}.{sorted(unknown)[0]}", f"unknown key for check {kind!r} (its options: "
                                                      f"{', '.join(cls.OPTIONS) or 'none'})")
        enforce = options.get("enforce", False)
        if not isinstance(enforce, bool):
            raise option_error(f"{at}.enforce", f"expected true or false, got {enforce!r}")
        error = options.get("error", cls.ERROR)
        if error not in ERROR_CODES or error == "NONE":
            raise option_error(f"{at}.error", f"expected a Kafka error name (POLICY_VIOLATION, ...), got {error!r}")
        rules.append(Rule(str(name), kind, enforce, error, cls(options, at)))
    return Policy(tuple(rules), source, data)


def load_policy(path: str | Path) -> Policy:
    """Read and parse a rules file (.toml, or .yaml/.yml)."""
    try:
        data = read_settings_file(path, "policy")
    except SettingsFileError as exc:
        raise PolicyError(str(exc)) from None
    return parse_policy(data, str(path))
