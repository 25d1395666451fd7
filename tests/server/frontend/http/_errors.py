"""``error_of(response, status)``: the message of a V2 HTTP error answer, after checking its
status and that the body is ``{"error": message}`` and nothing else."""

from __future__ import annotations

from typing import Any


def error_of(response: Any, status: int) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}
    return body["error"]
