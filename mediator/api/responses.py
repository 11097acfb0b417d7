"""How the routes answer JSON: :class:`FastJSON`, the body encoded once, by orjson.

A route returns its answer as a response, so FastAPI neither validates it against a model nor walks
it with ``jsonable_encoder`` (a Python pass over every value); the response models of
:mod:`mediator.api.schemas` document the shapes, the ``to_dict`` of ``mediator/core/rows.py`` make
them, already JSON-ready.
"""

from __future__ import annotations

import json
from typing import Any

import orjson
from fastapi import Response


class FastJSON(Response):
    """A JSON response encoded by orjson (about 12–15× ``json.dumps``, bench/bench_json.py).

    orjson writes no integer beyond 64 bits; such a value (a capability or a step's ``with`` may
    hold one: JSON has no limit, jsonb keeps it exact) is written by ``json`` instead."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        try:
            return orjson.dumps(content)
        except TypeError:  # orjson.JSONEncodeError too
            return json.dumps(content, ensure_ascii=False, separators=(",", ":")).encode()
