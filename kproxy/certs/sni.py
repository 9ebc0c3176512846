"""SNI routing: the host names kproxy advertises on its one port, and what a name routes to.

With ``routing = "sni"`` every node is advertised at a name made from a template
(``broker-{node_id}.kafka.example.com``), all on the one TLS port, plus a bootstrap
name. During the TLS handshake the server name the client sends is read back:
the bootstrap name goes to any upstream, a broker name to that node, anything else
is refused. Names and node ids map one to one (a name is accepted only if the
template makes exactly it from the id it holds), so no response can send a client
to one node under another node's name.

Pure: no sockets, no ssl; ``server.py`` calls ``route`` from the handshake.
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass

BOOTSTRAP = "bootstrap"       # what ``route`` returns for the bootstrap name
NODE_ID_FIELD = "node_id"
# One DNS label is at most 63 characters and a name at most 253 (RFC 1035); a template
# that breaks these for any plausible node id would fail in clients' resolvers, not here.
MAX_LABEL_CHARS = 63
MAX_NAME_CHARS = 253
_LABEL = re.compile(rf"^(?!-)[a-z0-9-]{{1,{MAX_LABEL_CHARS}}}(?<!-)$")
# Node ids are non-negative int32s: the widest id a template must still make a valid name for.
WIDEST_NODE_ID = 2**31 - 1


def _name_problem(name: str) -> str | None:
    """Why a client could not resolve this host name or send it as SNI, if so."""
    if len(name) > MAX_NAME_CHARS:
        return f"is longer than {MAX_NAME_CHARS} characters"
    labels = name.split(".")
    if len(labels) < 2:
        return "needs a dot (Java clients send no server name for a single-label host name)"
    bad = next((label for label in labels if not _LABEL.match(label)), None)
    if bad is not None:
        return (f"holds {bad!r}: a DNS label is letters, digits and inner hyphens, "
                f"1-{MAX_LABEL_CHARS} characters")
    if labels[-1].isdigit():
        return "looks like an IP address (clients send no server name for an address)"
    return None


@dataclass(frozen=True)
class NodeNames:
    """``broker-{node_id}.kafka.example.com`` plus a bootstrap name (both lower case)."""
    template: str
    bootstrap: str

    @classmethod
    def parse(cls, template: str, bootstrap: str) -> "NodeNames":
        """Validate both; ValueError with one clear line if either cannot work."""
        template, bootstrap = template.strip().lower(), bootstrap.strip().lower()
        try:
            fields = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
        except ValueError as exc:
            raise ValueError(f"template {template!r}: {exc}") from None
        if fields.count(NODE_ID_FIELD) != 1 or len(fields) != 1:
            raise ValueError(f"template {template!r} must hold {{{NODE_ID_FIELD}}} exactly once "
                             f"and nothing else in braces (e.g. 'broker-{{node_id}}.kafka.example.com')")
        if "{node_id}" not in template:
            raise ValueError(f"template {template!r}: write {{node_id}} without a format spec")
        names = cls(template, bootstrap)
        for name in (names.name_of(0), names.name_of(WIDEST_NODE_ID)):
            problem = _name_problem(name)
            if problem:
                raise ValueError(f"template {template!r} makes {name!r}, which {problem}")
        problem = _name_problem(bootstrap)
        if problem:
            raise ValueError(f"bootstrap name {bootstrap!r} {problem}")
        if names.node_of(bootstrap) is not None:
            raise ValueError(f"bootstrap name {bootstrap!r} is also a broker name by the template "
                             f"{template!r}; pick one the template cannot make")
        return names

    def name_of(self, node_id: int) -> str:
        return self.template.replace("{node_id}", str(node_id))

    def node_of(self, name: str) -> int | None:
        """The node a broker name stands for, if it is exactly the template's name for it."""
        prefix, _, suffix = self.template.partition("{node_id}")
        if not (name.startswith(prefix) and name.endswith(suffix)) or len(name) <= len(prefix) + len(suffix):
            return None
        digits = name[len(prefix):len(name) - len(suffix)]
        if not digits.isascii() or not digits.isdigit():
            return None
        node_id = int(digits)
        # "broker-01" is not node 1's name: one name per node, or two clients could
        # disagree about which connection is which node's.
        return node_id if node_id <= WIDEST_NODE_ID and self.name_of(node_id) == name else None

    def route(self, server_name: str | None) -> str | int | None:
        """BOOTSTRAP, a node id, or None (refuse) for the server name a client sent."""
        if not server_name:
            return None
        name = server_name.rstrip(".").lower()          # DNS names ignore case and a final dot
        if name == self.bootstrap:
            return BOOTSTRAP
        return self.node_of(name)


def certificate_covers(certificate_names: list[str], name: str) -> bool:
    """Whether a certificate for these DNS names is valid for ``name``, as clients check
    it (RFC 6125): exact, or a ``*`` standing for the whole first label."""
    name = name.lower()
    for pattern in (n.lower().rstrip(".") for n in certificate_names):
        if pattern == name:
            return True
        if pattern.startswith("*.") and "." in name and name.split(".", 1)[1] == pattern[2:]:
            return True
    return False
