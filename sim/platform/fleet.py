"""The fleet as the daemons behave — one definition for both brokers (issue 14 §1).

Why: the simulator has one platform and two schedulers plugged into it (the split Batsim uses):
the real Mediator (`sim.brokers.mediator`) and the reference policy (`sim.brokers.model`). What a
node's daemon does when the plan says `vanish`, `return`, `restart`, `drain`/`undrain` or `caps`
(wake 9) is the platform's, not the scheduler's; when each engine wrote it out, the two copies could
drift and the differential test would report a scheduling difference that was a fleet difference.

A `Daemon` is what runs on the machine — up or dark, its instance, the capabilities and drain
policy it will advertise, the step in flight — never what a broker knows about the node (that
is the broker's own state, set by adverts). `apply` changes a daemon for one fleet event and
says what the loop (`sim.platform.driver`, the only caller) must do about it:

- `VANISHED` — the machine went dark: no more adverts, claims or results; the step in flight is
  lost (its pending result is dropped by `run_epoch`) and the heartbeat schedule ends
  (`advert_epoch`). The loop lets the node's advert expire and runs the reaper timer.
- `RETURNED` — it booted with a fresh instance: the loop starts a new heartbeat schedule from
  now and advertises at once.
- `ADVERTISE` — `restart` (fresh instance, step in flight lost), or a new drain policy or
  capabilities on an up node: the loop advertises at once, keeping the heartbeat schedule.
- `HELD` — a new policy or capabilities for a dark node: it takes them on return; nothing now.
- `CANCEL` — an operator cancels the run leased on the node (the daemon is untouched): the loop
  asks the broker to cancel it (wake 2).
- `IGNORED` — an event that does not apply (vanish of a dark node, return of an up one, restart
  of a dark one).

Instances are `f"{node_id}#{k}"`, k = 0, 1, … per daemon start.
"""

from __future__ import annotations

from typing import Any, Final

from sim.inputs.scenarios import FleetEvent

VANISHED: Final = "vanished"
RETURNED: Final = "returned"
ADVERTISE: Final = "advertise"
HELD: Final = "held"
IGNORED: Final = "ignored"
CANCEL: Final = "cancel"


class Daemon:
    """One node's daemon as the plan drives it (see the module docstring)."""

    __slots__ = (
        "advert_epoch",
        "busy",
        "claim_pending",
        "daemon_caps",
        "daemon_drain",
        "instance",
        "node_id",
        "run_epoch",
        "starts",
        "up",
    )

    def __init__(self, node_id: str, caps: dict[str, Any]) -> None:
        self.node_id = node_id
        self.up = True  # running and advertising (every daemon starts at t = 0)
        self.starts = 0
        self.instance = f"{node_id}#0"
        self.daemon_caps = caps  # what it advertises (a `caps` event changes it, wake 9)
        self.daemon_drain = ""  # the drain policy it advertises
        self.busy: Any = (
            None  # the step it is executing (sim.platform.driver: its RESULT key), or None
        )
        self.run_epoch = 0  # bumps when the daemon dies: its pending result is never sent
        self.advert_epoch = 0  # bumps when the heartbeat schedule is replaced
        self.claim_pending = False  # a delayed claim (latency > 0) is scheduled

    def _boot(self) -> None:
        self.starts += 1
        self.instance = f"{self.node_id}#{self.starts}"

    def _lose_step(self) -> None:
        self.run_epoch += 1
        self.claim_pending = False
        self.busy = None


def apply(daemon: Daemon, ev: FleetEvent) -> str:
    """Apply one fleet event to its node's daemon; return what the broker must do (see above)."""
    kind = ev.kind
    if kind == "vanish":
        if not daemon.up:
            return IGNORED
        daemon.up = False
        daemon._lose_step()
        daemon.advert_epoch += 1
        return VANISHED
    if kind == "return":
        if daemon.up:
            return IGNORED
        daemon.up = True
        daemon._boot()
        daemon.advert_epoch += 1
        return RETURNED
    if kind == "restart":
        if not daemon.up:
            return IGNORED
        daemon._lose_step()
        daemon._boot()
        return ADVERTISE
    if kind == "cancel":
        return CANCEL
    if kind in ("drain", "undrain"):
        daemon.daemon_drain = ev.policy if kind == "drain" else ""
    elif kind == "caps" and ev.capabilities is not None:
        daemon.daemon_caps = dict(ev.capabilities)
    else:
        return IGNORED
    return ADVERTISE if daemon.up else HELD
