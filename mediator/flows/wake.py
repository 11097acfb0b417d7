"""The wake points of docs/design.md §8 as one enum: which event swept the queue.

Every flow names the wake it triggers with a member, never with free text, and hands it to the
after-commit object (:mod:`mediator.flows.after`), the one place a sweep is started. Each member
carries its wake number and the reason text the logs have always printed ("wake after advert
failed"), so log lines and their readers do not change. A wake point with two call sites (wake 1:
a result or an answer; wake 5: startup or a reconnect) has one member per site.
"""

from __future__ import annotations

from enum import Enum


class Wake(Enum):
    """A wake point: ``number`` is its row in docs/design.md §8, ``reason`` the log text."""

    RESULT = (1, "result")
    ANSWER = (1, "answer")
    CANCEL = (2, "cancel")
    REAP = (3, "reap")
    ADVERT_RELEASED = (4, "advert")
    STARTUP = (5, "startup")
    RECONNECT = (5, "reconnect")
    DRAIN_LIFTED = (6, "advert")
    NODE_RETURNED = (7, "advert")
    QUEUED_SUBMIT = (8, "queued submit")
    CAPABILITIES_CHANGED = (9, "advert")

    @property
    def number(self) -> int:
        return int(self.value[0])

    @property
    def reason(self) -> str:
        return str(self.value[1])

    def __str__(self) -> str:
        return self.reason
