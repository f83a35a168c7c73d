"""The service's OpenAPI 3.1 document, as `GET /openapi.json` serves it. Committed as
docs/openapi.json (a test fails when they differ); write it anew with

    .venv/bin/python -m sandboxer_tui.service.openapi > docs/openapi.json
"""

from __future__ import annotations

import json
import sys
from typing import Any


def document() -> dict[str, Any]:
    """The document, made without a database or a backend (the routes are not called)."""
    from sandboxer.service import ServiceClient
    from sandboxer_tui.service.app import build_app

    return build_app(ServiceClient(_transport=object()), actor="-").openapi()


def text() -> str:
    return json.dumps(document(), indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    sys.stdout.write(text())
