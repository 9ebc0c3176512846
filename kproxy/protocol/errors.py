"""The codec's one exception type.

Decoding untrusted bytes can fail in many low-level ways (short buffers,
bad lengths, invalid varints). All of them surface as ``DecodeError`` so a
caller needs exactly one ``except`` to keep forwarding safe.
"""


class DecodeError(ValueError):
    """Raised for any input the codec cannot decode; says where and why."""
