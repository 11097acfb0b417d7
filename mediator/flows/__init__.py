"""The one orchestration layer (docs/design.md §9; docs/architecture.md "Module map").

:class:`Mediator` is a thin facade; the flows live in small modules of this package, each a set of
functions of an explicit :class:`~mediator.flows.context.Context`, so every call from one flow
into another is a visible import:

- ``submit``  — submit and its three create paths (R1–R5, R17);
- ``sweep``   — WakeQueued: the promotion sweep and promote (R6–R12);
- ``advert``  — a node's heartbeat, restart detection, at-boundary drains (wakes 4, 6, 7, 9);
- ``steps``   — work, claim, result, and the shared moves progress/end/release;
- ``ending``  — cancel and the reaper (wakes 2, 3);
- ``asks``    — answering an ask (wake 1);
- ``reads``   — runs, nodes, open asks, analytics queries;
- ``after``   — :class:`AfterCommit`: seal what settled, PushAsks, wake; record retries;
- ``wake``    — :class:`Wake`, the wake points 1–9 as one enum;
- ``context`` — :class:`~mediator.flows.context.Context`, what every flow works with.
"""

from __future__ import annotations

from mediator.flows.after import AfterCommit, Change
from mediator.flows.ending import ReapReport
from mediator.flows.facade import Mediator
from mediator.flows.steps import ReportResult
from mediator.flows.submit import Outcome, Submission
from mediator.flows.sweep import WakeReport
from mediator.flows.wake import Wake

__all__ = [
    "AfterCommit",
    "Change",
    "Mediator",
    "Outcome",
    "ReapReport",
    "ReportResult",
    "Submission",
    "Wake",
    "WakeReport",
]
