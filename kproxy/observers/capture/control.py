"""Admin-listener helpers: plain dicts in, ``(HTTP status, JSON-able dict)`` out.

No asyncio and no HTTP here, so the admin routes stay one-liners::

    POST /capture/start   body: CaptureConfig fields as JSON  -> start_capture(capture, body, defaults)
    POST /capture/stop                                         -> stop_capture(capture)   (blocks: to_thread)
    GET  /capture                                              -> capture_status(capture)

``defaults`` (e.g. the ``capture`` table of kproxy's config file) fills in
what the request body leaves out, so an operator can start a capture with
just ``{"filter": {"apis": ["Produce"]}}``.
"""

from __future__ import annotations

import json
from typing import Any, Mapping

from .capture import Capture, CaptureError
from .config import CaptureConfig


def parse_json_body(body: bytes | str | None) -> tuple[int, dict] | dict:
    """Request body → dict; an empty body is ``{}``. Returns (400, error) for bad JSON."""
    if not body:
        return {}
    try:
        value = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        return 400, {"error": f"request body is not JSON: {exc}"}
    if not isinstance(value, dict):
        return 400, {"error": "request body must be a JSON object"}
    return value


def start_capture(capture: Capture, body: Mapping[str, Any] | None,
                  defaults: Mapping[str, Any] | CaptureConfig | None = None) -> tuple[int, dict]:
    """200 + status; 400 bad settings; 409 already running; 500 cannot create files."""
    merged: dict[str, Any] = {}
    if isinstance(defaults, CaptureConfig):
        merged.update(defaults.to_dict())
    elif defaults:
        merged.update(defaults)
    merged.update(body or {})
    try:
        config = CaptureConfig.from_dict(merged)
    except ValueError as exc:
        return 400, {"error": str(exc)}
    try:
        return 200, capture.start(config)
    except CaptureError as exc:
        return 409, {"error": str(exc), "status": capture.status()}
    except OSError as exc:
        return 500, {"error": f"cannot write captures to {config.directory}: {exc.strerror or exc}"}


def stop_capture(capture: Capture, timeout: float = 30.0) -> tuple[int, dict]:
    return 200, capture.stop(timeout)


def capture_status(capture: Capture) -> tuple[int, dict]:
    return 200, capture.status()
