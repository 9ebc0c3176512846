"""Every version of every address-bearing response: what the rewrite and SNI tests both run through."""

from kproxy.protocol import schema
from kproxy.proxy.rewrite import ADDRESS_BEARING

REWRITE_CASES = [(key, v) for key, (first, _) in sorted(ADDRESS_BEARING.items())
                 for v in range(max(first, schema.RESPONSES[key].versions[0]), schema.RESPONSES[key].versions[1] + 1)]
