"""kproxy: a transparent, protocol-decoding Kafka TCP proxy."""

__version__ = "0.1.0"
