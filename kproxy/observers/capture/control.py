"""Admin-listener helpers: plain dicts in, ``(HTTP status, JSON-able dict)`` out.

No asyncio and no HTTP here, so the admin routes stay one-liners::

    POST /capture/start   body: CaptureConfig fields as JSON  -> start_capture(capture, body, defaults, root=...)
    POST /capture/stop                                         -> stop_capture(capture)   (blocks: to_thread)
    GET  /capture                                              -> capture_status(capture)

``defaults`` (e.g. the ``capture`` table of kproxy's config file) fills in
what the request body leaves out, so an operator can start a capture with
just ``{"filter": {"apis": ["Produce"]}}``.

What a request body cannot do, whoever sends it (the admin listener checks the
token before any of this runs): write outside ``root`` (the operator's
``capture_root``; a relative directory is taken under it, the root itself by
default), capture record data unless the operator allowed it
(``allow_record_data``, from ``capture_allow_record_data`` in the config), and
name where rows or files are shipped (``kafka``, ``s3``: the operator's config
alone says that, or an admin token would be enough to copy traffic anywhere).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Mapping

from .capture import Capture, CaptureError
from .config import CaptureConfig
from .files import directory_in_root


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
                  defaults: CaptureConfig | None = None, *,
                  root: str | None, allow_record_data: bool = False) -> tuple[int, dict]:
    """200 + status; 400 bad settings; 403 refused by the operator's settings (no
    ``root``, or record data not allowed); 409 already running; 500 cannot create files."""
    for key in ("kafka", "s3"):
        if body and key in body:
            return 403, {"error": f"capture.{key}: refused: where captures are shipped is set in "
                                  f"kproxy's config only (the capture table or KPROXY_CAPTURE)"}
    merged: dict[str, Any] = defaults.to_dict() if defaults is not None else {}
    merged.update(body or {})
    try:
        ships_only = not CaptureConfig.from_dict({**merged, "directory": "-"}).file_formats
    except ValueError as exc:
        return 400, {"error": str(exc)}
    if root is None and not ships_only:
        return 403, {"error": "capture is off: no capture_root is configured (set capture_root "
                              "or capture.directory in kproxy's config)"}
    if ships_only:
        merged["directory"] = ""                  # rows go to capture.kafka only: no files
    elif not merged.get("directory"):
        merged["directory"] = root                # asked for the default: the root itself
    try:
        config = CaptureConfig.from_dict(merged)
        if config.file_formats:
            config = dataclasses.replace(config, directory=directory_in_root(root, config.directory))
    except ValueError as exc:
        return 400, {"error": str(exc)}
    if config.include_record_data and not allow_record_data:
        return 403, {"error": "capture.include_record_data: refused: record keys and values are "
                              "captured only when the operator sets capture_allow_record_data = true "
                              "in kproxy's config"}
    try:
        return 200, capture.start(config)
    except CaptureError as exc:
        return 409, {"error": str(exc), "status": capture.status()}
    except OSError as exc:
        where = config.directory or (config.kafka and f"kafka://{config.kafka.bootstrap}/{config.kafka.topic}")
        return 500, {"error": f"cannot write captures to {where}: {exc.strerror or exc}"}


def stop_capture(capture: Capture, timeout: float = 30.0) -> tuple[int, dict]:
    return 200, capture.stop(timeout)


def capture_status(capture: Capture) -> tuple[int, dict]:
    return 200, capture.status()
