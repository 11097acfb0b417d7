"""Routes 9 and 10: a run's record — its manifest and one file (docs/design.md §7.7).

No path traversal: ``Records.read_file`` stays inside the run's folder (docs/security.md).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response

from mediator.api.deps import Caller, Med
from mediator.api.schemas import V1, RecordFile, RunId, answers
from mediator.core.errors import NotFound

router = APIRouter(tags=["records"])


# 9 -- record manifest
@router.get("/v1/runs/{run_id}/record", responses=answers({}, 400, 404, *V1))
def get_record(run_id: RunId, med: Med, p: Caller) -> dict[str, Any]:
    med.get_run(run_id)  # 404 for an unknown run
    manifest = med.records.manifest(run_id)
    if manifest is None:
        raise NotFound(f"Run {run_id} has no record yet.", code="no_record")
    return manifest


# 10 -- one record file
@router.get("/v1/runs/{run_id}/record/{file:path}", responses=answers({}, 400, 404, *V1))
def get_record_file(run_id: RunId, file: RecordFile, med: Med, p: Caller) -> Response:
    med.get_run(run_id)
    try:
        data = med.records.read_file(run_id, file)
    except (OSError, ValueError):  # a name the file system refuses (too long, NUL) is no file
        data = None
    if data is None:
        raise NotFound("No such file in this run's record.", code="no_such_file", field="file")
    kind = "application/json" if file.endswith(".json") else "text/plain; charset=utf-8"
    return Response(data, media_type=kind)
