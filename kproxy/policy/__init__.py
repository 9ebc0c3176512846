"""Policy rules: checks operators want on client requests, rehearsed before they are enforced.

Pure logic (no I/O, no asyncio; imports only ``kproxy.protocol``), shared by the three
places that judge requests so that they agree:

- ``observers/policy`` judges every request live (dry run): metrics, live page;
- ``proxy/policy_answers`` refuses the requests that break a rule marked ``enforce``,
  answering them itself with the error a broker would give (``answers``);
- ``pipeline/policy`` judges capture rows after the fact (``kproxy analyze``).

- ``rules.py``: the rules file (TOML or YAML), parsed once into a ``Policy``.
- ``checks.py``: the checks a rule may name.
- ``subject.py``: what a rule looks at in one request, from a decoded request or a
  capture row alike.
- ``answers.py``: the answer kproxy gives a refused request.
"""

from .answers import refusal_answer
from .checks import CHECKS, PolicyError
from .rules import Policy, Rule, Violation, load_policy
from .subject import Subject

__all__ = ["CHECKS", "Policy", "PolicyError", "Rule", "Subject", "Violation", "load_policy",
           "refusal_answer"]
