"""docs/security.md names every limit of issue 25 with its value; this keeps them in step with
the code (the request-input limits have their own check in tests/adversarial/test_limits.py)."""

from __future__ import annotations

from pathlib import Path

from mediator import client, records
from mediator.api import auth, guard

DOC = Path(__file__).parents[2].joinpath("docs", "security.md").read_text("utf-8")


def shown(value: float) -> str:
    """How the doc writes a value: thousands separated, no ``.0``."""
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:g}"


def test_every_hostile_world_limit_is_documented_with_its_value() -> None:
    limits = {
        "MAX_CONNECTIONS": guard.MAX_CONNECTIONS,
        "HEADER_TIMEOUT_S": guard.HEADER_TIMEOUT_S,
        "BODY_TIMEOUT_S": guard.BODY_TIMEOUT_S,
        "LOOP_ERROR_EVERY_S": guard.LOOP_ERROR_EVERY_S,
        "MIN_TOKEN_BYTES": auth.MIN_TOKEN_BYTES,
        "DEFAULT_TIMEOUT": client.DEFAULT_TIMEOUT,
        "MAX_RESPONSE_BYTES": client.MAX_RESPONSE_BYTES,
        "MIN_ADVERT_TTL": client.MIN_ADVERT_TTL,
        "MAX_ADVERT_TTL": client.MAX_ADVERT_TTL,
        "MAX_LISTED": client.MAX_LISTED,
        "STALE_STAGING_S": records.STALE_STAGING_S,
    }
    for name, value in limits.items():
        line = next((ln for ln in DOC.splitlines() if f"`{name}`" in ln), "")
        assert shown(value) in line, (name, shown(value), line)
