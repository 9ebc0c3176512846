"""Which client software a connection runs: Kafka's rule, in one place.

ApiVersions v3+ requests name the client's software (KIP-511). The broker
registers that name for the connection when it accepts the request (error 0;
it answers INVALID_REQUEST to malformed names), and a later ApiVersions on the
same connection replaces the registration (Kafka's ``ChannelMetadataRegistry``
keeps one): franz-go's admin client ``kadm`` sends its own ApiVersions on
connections that ``kgo`` opened. So a connection's client software is the one
its latest accepted ApiVersions v3+ named; before any, it is unknown.

Every surface that says which client a connection is follows ``software_named``:
the metrics (``kproxy_client_software_connections``), capture rows (each row
carries its connection's software as of that pair), ``kproxy capture stats``
and the pipeline (a connection's software is its latest row's), and the live
page's client inventory.
"""

from __future__ import annotations

from dataclasses import dataclass

from .api_keys import ApiKey
from .pair_fields import pair_fields

FIRST_NAMING_VERSION = 3          # ApiVersions v3+ requests carry the software's name and version


@dataclass(frozen=True, slots=True)
class ClientSoftware:
    name: str
    version: str


def software_named(response) -> ClientSoftware | None:
    """The client software a ResponseReceived makes its connection's from now on: an
    ApiVersions v3+ that the broker accepted and that names it; None for any other pair."""
    request = response.request_event
    if request.api_key != ApiKey.API_VERSIONS or request.api_version < FIRST_NAMING_VERSION:
        return None
    # Only the error code is read: the skimmed answer has it (``skim``) and the metrics made
    # it already. The whole answer (~80 API entries) took ~1 ms per connection to decode,
    # ~1 s of CPU when a gateway's 1,000 clients (re)connect.
    answer = response.partial
    if answer is None or answer.is_opaque or answer.body.__dict__.get("error_code"):
        return None
    decoded = request.request
    if decoded is None or decoded.is_opaque:
        return None
    fields = pair_fields(ApiKey.API_VERSIONS, decoded.body, None)
    if not fields["client_software_name"]:
        return None
    return ClientSoftware(fields["client_software_name"], fields["client_software_version"] or "")
