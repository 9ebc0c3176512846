"""Server names Python's ssl cannot hand to kproxy's SNI callback.

CPython decodes the server name a ClientHello carries as ASCII before it calls
``SSLContext.sni_callback``. A name that is not ASCII (``bröker-1…``, or bytes that
are not text at all) never reaches the callback: CPython reports the decode error
as an "unraisable" exception (a traceback on stderr, once per handshake, as fast
as a client can send hellos) and fails the handshake with ``internal_error``, which
kproxy's handshake-failure hook then takes for its own callback's refusal. No client
library sends such a name; a hostile one can.

``watch(loop, on_name)`` sends those to ``on_name(raw bytes)`` instead (counted and
logged within a budget there). The hook is process-wide (``sys.unraisablehook``);
the event loop running the handshake tells which kproxy's it is (several run in one
process in tests). Anything else unraisable goes to the hook that was there before.
"""

from __future__ import annotations

import asyncio
import sys
import weakref
from typing import Callable

_handlers: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Callable[[bytes], None]]" = \
    weakref.WeakKeyDictionary()
_previous_hook = None


def _is_server_name(args) -> bool:
    """The shape of CPython's report (``_servername_callback`` in ``_ssl.c``): an ASCII
    decode error, the undecodable bytes given as the object."""
    exc, obj = args.exc_value, args.object
    return (isinstance(exc, UnicodeDecodeError) and exc.encoding == "ascii"
            and isinstance(obj, bytes) and exc.object == obj and args.err_msg is None)


def _hook(args) -> None:
    handler = None
    if _is_server_name(args):
        try:
            handler = _handlers.get(asyncio.get_running_loop())
        except RuntimeError:            # not on an event loop: not a handshake of kproxy's
            handler = None
    if handler is None:
        (_previous_hook or sys.__unraisablehook__)(args)
        return
    handler(args.object)


def watch(loop: asyncio.AbstractEventLoop, on_name: Callable[[bytes], None]) -> None:
    """Send undecodable server names of handshakes run on ``loop`` to ``on_name``."""
    global _previous_hook
    if sys.unraisablehook is not _hook:
        _previous_hook, sys.unraisablehook = sys.unraisablehook, _hook
    _handlers[loop] = on_name


def unwatch(loop: asyncio.AbstractEventLoop) -> None:
    _handlers.pop(loop, None)
