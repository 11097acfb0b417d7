"""The node daemon's loop: advertise, poll for work, claim, run the action, report (design.md §19).

The daemon talks to the Mediator over HTTP only (``mediator.client``; architecture.md forbids
importing the store or the API). It is written as one :meth:`Daemon.tick` — advertise if due,
poll, claim one step, run it, report — that tests call directly with a fake clock, a fake sleep
and any client; the program's main loop (:meth:`Daemon.run`) only calls ``tick`` and idles
between polls.

Rules it follows, and why:

* A fresh ``instance`` per start (uuid4): the Mediator's restart detection (design.md §10) tells
  a restarted node from a live one by it, and refuses claims and results of an old instance.
* Adverts every ``advert_ttl/3`` seconds, the TTL taken from each advert's answer (design.md §16:
  the server paces its nodes), and during a long step too — adverts renew the run's lease.
* A result the server did not receive (no answer, or 5xx) is kept and sent again before any new
  claim; the server decides whether it still counts (409 ``stale_attempt``/``run_ended`` drop it).
* 409 ``run_ended`` on a claim or a result: the run is over; the daemon stops working on it.
* Any other 4xx on a result is final (issue 11 §3): retrying cannot change the answer. The log is
  kept in a file on the node (``keep_dir``) and the step is reported ``fail`` once more with a
  short reason the server can take (what was refused, where the log is kept). Logs are escaped
  before they are sent (NUL, lone surrogates: :func:`escape_log`), so a step's output cannot
  make its own result unsendable.
* Idle, it long-polls (docs/design.md §19 "The wake of a waiting node"): the work poll asks the
  server to hold its answer up to ``long_poll`` seconds — ending before the next advert is due —
  and the server answers as soon as the node may have a step, so an idle node costs one request
  per advert interval instead of one a second, and a new run starts at once instead of at the
  next poll. The held request ends at once on :meth:`stop` or :meth:`set_drain` (the wake pipe
  below), and while stopping the daemon polls plainly, as before. A server that ignores ``wait``
  (no ``X-Mediator-Wait`` header: an older Mediator) or holds nothing (``0``: over its cap) is
  polled every ``poll_seconds`` instead.
* Drain (the policy travels in the advert): ``--drain`` sets it at start; :meth:`set_drain` (the
  program wires SIGUSR1 → ``graceful``, SIGUSR2 → none) or a drain file change it while running.
* :meth:`stop` (SIGTERM, SIGINT): advertise ``drain: graceful`` (an ``at-boundary`` drain is kept:
  it is the stricter one), claim only steps of the run this node holds a lease for, and finish when
  the server shows no lease for it — the current step and run finish, no new run starts. A second
  :meth:`stop` finishes after the current step. While the server cannot be reached the daemon
  cannot know whether it still holds a run, so it keeps trying — for ``stop_grace`` seconds, then
  it exits; a second signal exits at once. Either way a result not yet delivered is kept in
  ``keep_dir`` (issue 11 §3: a stop is always honoured, even while retrying).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import select
import time
import traceback
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from mediator.client import ApiError, Client, Interrupt, Interrupted, Unreachable
from mediator.enode.actions import (
    Action,
    Context,
    Outcome,
    Retry,
    escape_log,
    load_actions,
    truncate,
)

log = logging.getLogger("mediator.enode")

DRAIN_POLICIES: Final = ("", "graceful", "at-boundary")
DEFAULT_POLL: Final = 1.0
# The longest a work poll asks the server to hold (seconds); the server caps it too
# (work_wait_max_seconds, 25 s). --long-poll; 0 polls every poll_seconds instead.
DEFAULT_LONG_POLL: Final = 25.0
# Before the first advert answers we do not know the server's TTL; retry adverts this often.
_RETRY_ADVERT: Final = 1.0
# A 413 on a result means the log is too big for this server: send the tail that fits this.
_SHORT_LOG: Final = 4 * 1024
# A long poll shorter than this is not worth asking for: poll plainly (the advert is nearly due).
_MIN_LONG_POLL: Final = 0.5
# Claim refusals after which no other step of this poll is worth trying.
_STOP_POLL_CODES: Final = frozenset({"draining", "stale_instance"})
# How long a stopping node keeps trying a server it cannot reach (seconds); --stop-grace.
DEFAULT_STOP_GRACE: Final = 30.0
# Result refusals that say "this body can never be taken": report a short failure instead.
_UNSENDABLE: Final = frozenset({400, 413, 422})
# Refusals that say "the server has decided": nothing to send instead.
_DECIDED: Final = frozenset({404, 409})


class DaemonError(Exception):
    """The server refused the node for good (400/401/403 on an advert): the program exits 1."""


@dataclass
class _Report:
    run_id: str
    seq: int
    attempt: int
    outcome: str
    log: str
    full: str = ""  # the whole (escaped) log, kept on the node if the server refuses it
    fallback: bool = False  # this is already the short failure sent instead of a refused result
    shortened: bool = False  # already cut to _SHORT_LOG after a 413


class Daemon:
    """One node: its identity, its policy and its loop.

    Args:
        client: The HTTP client (tests may pass one on an in-process server).
        node_id: The node's id.
        capabilities: The capability object it advertises.
        label: A human label for panels.
        drain: The drain policy at start: ``""``, ``"graceful"`` or ``"at-boundary"``.
        instance: The instance id; a fresh uuid4 hex when ``None``.
        actions: ``{name: action}``; the built-ins and installed plugins when ``None``.
        poll_seconds: Idle time between work polls when the server holds none.
        long_poll: The longest the server may hold a work poll (a long poll; 0: none). ``None``:
            :data:`DEFAULT_LONG_POLL` when the daemon waits in real time (no ``sleep`` given),
            else 0 — a held request takes real time, which a fake clock cannot skip.
        drain_file: A file whose content (``graceful``, ``at-boundary`` or empty) is the policy
            while it exists; read at every tick. When it is removed, ``drain`` applies again.
        clock: Monotonic seconds (tests: a fake).
        sleep: How the daemon waits (tests: a fake that advances the fake clock). When ``None``,
            idle waits end early on :meth:`stop` or :meth:`set_drain`.
    """

    def __init__(
        self,
        client: Client,
        node_id: str,
        capabilities: Mapping[str, Any],
        *,
        label: str = "",
        drain: str = "",
        instance: str | None = None,
        actions: Mapping[str, Action] | None = None,
        poll_seconds: float = DEFAULT_POLL,
        drain_file: str | Path | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] | None = None,
        keep_dir: str | Path | None = None,
        stop_grace: float = DEFAULT_STOP_GRACE,
        long_poll: float | None = None,
    ) -> None:
        _check_drain(drain)
        self.client = client
        self.node_id = node_id
        self.capabilities = dict(capabilities)
        self.label = label
        self.instance = instance or uuid.uuid4().hex
        self.actions = dict(load_actions() if actions is None else actions)
        self._send_actions = True  # False once a Mediator refused the field (an older server)
        self.poll_seconds = poll_seconds
        self.long_poll = (
            (DEFAULT_LONG_POLL if sleep is None else 0.0) if long_poll is None else (long_poll)
        )
        self._poll_again = False  # the server held the last poll: the next one follows at once
        self.clock = clock
        self.drain = drain
        self.advert_ttl: float | None = None
        self.finished = False
        self._start_drain = drain
        self._drain_file = Path(drain_file) if drain_file is not None else None
        self._drain_file_text: str | None = None
        # Read every second while a poll is held, so a held poll ends when the file changes.
        self._drain_check = self._drain_file_changed if self._drain_file is not None else None
        self._advertised_drain: str | None = None  # policy of the last advert the server took
        self._next_advert = -float("inf")  # the heartbeat: due at the first tick
        self._not_before = -float("inf")  # no advert before this (after one went unanswered)
        self._ended: set[str] = set()
        self._unreported: _Report | None = None
        # A claim sent whose answer never came (docs/design.md §9 "A lost answer"): it may have
        # committed, and then no poll offers the step again. (run_id, seq) until settled.
        self._unsure_claim: tuple[str, int] | None = None
        self._stopping = False
        self._stop_now = False
        self._fatal: DaemonError | None = None
        self._down = False
        self._down_since: float | None = None
        self._result_failing_since: float | None = None  # the kept result's first failed send
        self._keep_dir = Path(keep_dir) if keep_dir is not None else None
        self.stop_grace = stop_grace
        # The self-pipe that ends an idle wait early. Not a threading.Event: stop() runs in a
        # signal handler, which may interrupt the main thread while it holds the Event's lock,
        # and a pipe write takes no lock.
        self._wake_r: int | None = None
        self._wake_w: int | None = None
        self._sleep = sleep or time.sleep
        self._idle = sleep or self._wait_for_wake

    # ---- control (signal handlers call these) ----------------------------------------------------

    def stop(self) -> None:
        """First call: drain gracefully and finish the held run; second: finish after this step."""
        if self._stopping:
            self._stop_now = True
            log.info("stopping after the current step")
        else:
            self._stopping = True
            if self.drain != "at-boundary":
                self._set_drain("graceful")
            log.info("stopping: drain %s, finishing the current run", self.drain)
        self._nudge()

    def set_drain(self, policy: str) -> None:
        """Change the drain policy; the next tick advertises it. Ignored once stopping."""
        _check_drain(policy)
        if self._stopping:
            log.info("drain %r ignored: the node is stopping", policy)
            return
        self._set_drain(policy)
        self._nudge()

    def _set_drain(self, policy: str) -> None:
        if policy != self.drain:
            log.info("drain policy %r -> %r", self.drain, policy)
            # Nothing else: the advert is due because self.drain now differs from the policy
            # last advertised. Resetting the heartbeat here instead would race with an advert in
            # flight in the main thread (this runs in a signal handler), which would then set the
            # next advert a whole interval away and lose the change.
            self.drain = policy

    # ---- the loop ----------------------------------------------------------------------------

    def run(self) -> int:
        """Tick until finished. Returns the exit status: 0, or 1 if the server refused the node."""
        log.info("node %s instance %s -> %s", self.node_id, self.instance, self.client.url)
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        try:
            while not self.finished:
                if not self.tick() and not self.finished:
                    self._idle(self._idle_time())
        except DaemonError as exc:
            log.error("%s", exc)
            return 1
        finally:
            fds, self._wake_r, self._wake_w = (self._wake_r, self._wake_w), None, None
            for fd in fds:
                os.close(fd)
        log.info("node %s stopped", self.node_id)
        return 0

    def tick(self) -> bool:
        """One iteration: advertise if due, poll, claim one step, run it, report.

        Returns:
            True if a step was run (the caller polls again at once), False if there was nothing
            to do now (the caller idles).

        Raises:
            DaemonError: The server refused the advert for good.
        """
        self._poll_again = False  # set again only by this tick's held poll
        if self.finished:
            return False
        self._read_drain_file()
        self.advert_if_due()
        self._raise_fatal()
        if self._stop_now or self._gave_up_stopping():
            self._keep_unreported("the node stopped before the Mediator took it")
            self.finished = True
            return False
        if self._unreported is not None and not self._flush():
            return False  # a result the server has not taken comes before any new claim
        try:
            if self._unsure_claim is not None:
                mine = self._settle_claim(*self._unsure_claim)
                if mine is not None:
                    self._execute(mine)
                    return True
            return self._poll_and_work()
        except _NotNow:
            return False

    def _poll_and_work(self) -> bool:
        only_run = self._held_run() if self._stopping else None
        if self._stopping and only_run is None:
            self.finished = True
            return False
        try:
            steps = self._poll(stopping=self._stopping)
        except ApiError as exc:
            self._note_failure("work poll", exc)
            return False
        self._ended &= {s["run_id"] for s in steps}  # a run no longer offered needs no memory
        for step in steps:
            if step["run_id"] in self._ended or step.get("kind", "exec") != "exec":
                continue
            if only_run is not None and step["run_id"] != only_run:
                continue
            claimed = self._claim(step)
            if claimed is not None:
                self._execute(claimed)
                return True
        return False

    def _poll(self, stopping: bool) -> list[dict[str, Any]]:
        """The claimable steps: a long poll when the server holds them, else a plain one.

        Raises:
            _NotNow: :meth:`stop` or :meth:`set_drain` ended the held poll (the next tick acts).
        """
        wait = min(self.long_poll, self._advert_due_in())
        if stopping or self._wake_r is None or wait < _MIN_LONG_POLL:
            return self.client.work(self.node_id)
        asked = time.monotonic()  # real time: the server holds in real time
        try:
            steps, granted = self.client.work_wait(
                self.node_id, wait, Interrupt(self._wake_r, self._drain_check)
            )
        except Interrupted:
            # The flags it announced are set already: the next tick, at once, reads them.
            self._drain_wake()
            self._poll_again = True
            raise _NotNow from None
        if not steps and granted:
            # Held, and nothing came: ask again at once — unless it came back well before its
            # time, which only a stopping server does (then poll at the plain pace).
            self._poll_again = time.monotonic() - asked >= min(wait, granted) / 2
        return steps

    def _idle_time(self) -> float:
        if self._poll_again:
            return 0.0
        return max(0.0, min(self.poll_seconds, self._advert_due_in()))

    def _wait_for_wake(self, seconds: float) -> None:
        r = self._wake_r
        if r is None:  # not inside run(): nothing can nudge
            time.sleep(seconds)
            return
        select.select([r], [], [], seconds)
        self._drain_wake()

    def _drain_wake(self) -> None:
        r = self._wake_r
        if r is not None:
            with contextlib.suppress(BlockingIOError):
                while os.read(r, 64):
                    pass

    def _nudge(self) -> None:
        w = self._wake_w
        if w is not None:
            # Full pipe: a wake-up is already pending. Closed: run() is over.
            with contextlib.suppress(OSError):
                os.write(w, b"\0")

    # ---- adverts -------------------------------------------------------------------------------

    def advert_if_due(self) -> None:
        """Advertise if the last advert is ``advert_ttl/3`` old (or the policy changed).

        Safe to call from inside an action (it is the heartbeat): it never raises; a refusal for
        good is kept and raised by the next :meth:`tick`.
        """
        if self._advert_due_in() > 0:
            return
        now = self.clock()
        drain = self.drain
        try:
            try:
                ttl = self._advert(drain)
            except ApiError as exc:
                if not (self._send_actions and exc.code == "unknown_field"
                        and exc.field == "actions"):  # fmt: skip
                    raise
                # A Mediator from before adverts carried actions (docs/design.md §4 "Actions"):
                # advertise without them, as such a server expects; it checks no plugin `uses`.
                log.info("the Mediator takes no actions in adverts; advertising without them")
                self._send_actions = False
                ttl = self._advert(drain)
        except ApiError as exc:
            if isinstance(exc, Unreachable) or exc.status >= 500 or exc.status == 429:
                self._note_failure("advert", exc)
                self._not_before = now + min(_RETRY_ADVERT, self._interval())
            else:
                self._fatal = DaemonError(f"the Mediator refused node {self.node_id}: {exc}")
                self._not_before = float("inf")
            return
        self._note_recovery()
        if self._advertised_drain != drain:
            # The first advert, or a policy change: a line a person or a test can wait for.
            log.info("advertised node %s (drain %r, advert ttl %g s)", self.node_id, drain, ttl)
        self.advert_ttl = ttl
        self._advertised_drain = drain
        self._next_advert = now + self._interval()

    def _advert(self, drain: str) -> float:
        """One advert, with the actions this node offers (built-ins and plugins) unless the
        Mediator is too old to take them."""
        actions = sorted(self.actions) if self._send_actions else None
        return self.client.advert(
            self.node_id, self.capabilities, self.instance, label=self.label, drain=drain,
            actions=actions,
        )  # fmt: skip

    def _advert_due_in(self) -> float:
        """Seconds until an advert is due: the heartbeat's, or now if the policy changed."""
        now = self.clock()
        due = now if self.drain != self._advertised_drain else self._next_advert
        return max(due, self._not_before) - now

    def _interval(self) -> float:
        return self.advert_ttl / 3 if self.advert_ttl else _RETRY_ADVERT

    def _raise_fatal(self) -> None:
        if self._fatal is not None:
            self.finished = True
            raise self._fatal

    def _held_run(self) -> str | None:
        """The run this node holds a lease for, or ``None``.

        Known only after the server has taken a draining advert: before that a new run could
        still be leased to this node between the answer and the exit.

        Raises:
            _NotNow: It cannot be known yet.
        """
        if not self._advertised_drain:
            raise _NotNow
        try:
            fleet = self.client.nodes()
        except ApiError as exc:
            self._note_failure("fleet read", exc)
            raise _NotNow from None
        for node in fleet.get("nodes", []):
            if node.get("node_id") == self.node_id:
                lease = node.get("lease")
                return str(lease["run_id"]) if lease else None
        return None  # not listed: expired, so it holds nothing

    # ---- claim, run, report ----------------------------------------------------------------------

    def _claim(self, step: Mapping[str, Any]) -> dict[str, Any] | None:
        """The step as claimed, or ``None`` if this one is not to be had (try the next one).

        Raises:
            _NotNow: No step is to be had in this poll (no answer, or the node is refused).
        """
        run_id, seq = step["run_id"], step["seq"]
        try:
            return self.client.claim(run_id, seq, self.node_id, self.instance)
        except ApiError as exc:
            if isinstance(exc, Unreachable) or exc.status >= 500:
                self._note_failure("claim", exc)
                self._unsure_claim = (run_id, int(seq))  # it may have committed all the same
                raise _NotNow from None
            log.info("claim %s/%s refused: %s", run_id, seq, exc)
            if exc.code == "run_ended":
                self._ended.add(run_id)
            elif exc.code == "stale_instance":
                # The server has not seen this instance on the lease yet; an advert rebinds it
                # (docs/design.md §10) or fails the run, either way the next poll is right.
                self._next_advert = -float("inf")
            if exc.code in _STOP_POLL_CODES:
                raise _NotNow from None
            return None

    def _settle_claim(self, run_id: str, seq: int) -> dict[str, Any] | None:
        """Learn whether a claim whose answer was lost committed, by reading its run
        (docs/design.md §9 "A lost answer"). The step, when this instance holds it CLAIMED in
        a RUNNING run: it is this node's to run, and no poll will offer it again. ``None`` when
        it is not (a claim that never arrived is offered again by the next poll); a claim that
        committed in a run that has ended since is reported at once, unrun, so that the lease
        the run's end left to it (I2's exception) is freed.

        Raises:
            _NotNow: No answer again; the next tick asks again.
        """
        try:
            state, step = self.client.run_step(run_id, seq)
        except ApiError as exc:
            if isinstance(exc, Unreachable) or exc.status >= 500 or exc.status == 429:
                self._note_failure("claim check", exc)
                raise _NotNow from None
            log.warning("claim check of %s/%s refused: %s", run_id, seq, exc)
            self._unsure_claim = None
            return None
        self._note_recovery()
        self._unsure_claim = None
        if step is None or (step.get("state"), step.get("node_id"), step.get("instance")) != (
            "CLAIMED",
            self.node_id,
            self.instance,
        ):
            return None  # not taken (or not by this instance): the next poll says what is left
        log.info("run %s step %s: the claim whose answer was lost was taken", run_id, seq)
        if state != "RUNNING":
            note = f"enode: not run; run {run_id} ended while this claim's answer was lost.\n"
            self._unreported = _Report(run_id, seq, int(step["attempt"]), "fail", note)
            self._flush()
            return None
        return step

    def _execute(self, step: Mapping[str, Any]) -> None:
        run_id, seq, attempt = step["run_id"], int(step["seq"]), int(step["attempt"])
        uses = step.get("uses") or "shell"
        log.info("run %s step %s (%s) attempt %s: %s", run_id, seq, step.get("name"), attempt, uses)
        ctx = Context(
            run_id=run_id,
            seq=seq,
            name=str(step.get("name", "")),
            attempt=attempt,
            node_id=self.node_id,
            instance=self.instance,
            heartbeat=self.advert_if_due,
            sleep=self._sleep_with_heartbeat,
        )
        outcome = self._perform(uses, step.get("with") or {}, ctx)
        log.info("run %s step %s: %s", run_id, seq, outcome.outcome)
        full = escape_log(outcome.log)
        self._unreported = _Report(run_id, seq, attempt, outcome.outcome, truncate(full), full)
        self._flush()

    def _perform(self, uses: str, with_: Mapping[str, Any], ctx: Context) -> Outcome:
        action = self.actions.get(uses)
        if action is None:
            known = ", ".join(sorted(self.actions))
            return Outcome("fail", f"unknown action {uses!r}; this node has: {known}\n")
        try:
            result = action(with_, ctx)
        except Retry as exc:
            return Outcome("retry", f"{exc}\n" if str(exc) else "")
        except Exception:  # the action is someone else's code: its failure is the step's
            return Outcome("fail", traceback.format_exc())
        if not isinstance(result, Outcome):
            return Outcome("fail", f"action {uses!r} returned {result!r}, not an Outcome\n")
        return result

    def _sleep_with_heartbeat(self, seconds: float) -> None:
        end = self.clock() + seconds
        while (left := end - self.clock()) > 0:
            self.advert_if_due()
            self._sleep(max(0.0, min(left, self._advert_due_in())))

    def _flush(self) -> bool:
        """Send the kept result. False if it must be sent again later."""
        r = self._unreported
        assert r is not None
        try:
            answer = self.client.report(
                r.run_id,
                r.seq,
                node_id=self.node_id,
                instance=self.instance,
                attempt=r.attempt,
                outcome=r.outcome,
                log=r.log,
            )
        except ApiError as exc:
            if isinstance(exc, Unreachable) or exc.status >= 500:
                self._note_failure("result", exc)
                if self._result_failing_since is None:
                    self._result_failing_since = self.clock()
                return False
            self._result_failing_since = None
            if exc.status == 413 and not r.shortened and len(r.log.encode("utf-8")) > _SHORT_LOG:
                # Once: truncate's "[… cut …]" line makes the result longer than _SHORT_LOG, so
                # a length test alone would send it again and again.
                r.log, r.shortened = truncate(r.log, _SHORT_LOG), True
                return self._flush()
            log.warning("result of %s/%s refused: %s", r.run_id, r.seq, exc)
            if exc.code == "run_ended":
                self._ended.add(r.run_id)
            if exc.status in _DECIDED or r.fallback or exc.status not in _UNSENDABLE:
                if exc.status not in _DECIDED:
                    self._keep_unreported(f"the Mediator refused it: {exc}")
                self._unreported = None
                return True
            # Final (4xx): keep the log here, tell the server the step failed and why.
            kept = self._keep(r, f"the Mediator refused it: {exc}")
            where = f"kept on node {self.node_id} at {kept}" if kept else "could not be kept"
            reason = (
                f"enode: the Mediator refused this step's result ({exc.status} "
                f"{exc.code or 'refused'}); the step's {r.outcome!r} log of "
                f"{len(r.full.encode('utf-8'))} bytes {where}.\n"
            )
            self._unreported = _Report(
                r.run_id, r.seq, r.attempt, "fail", escape_log(reason), fallback=True
            )
            return self._flush()
        self._note_recovery()
        self._unreported = None
        self._result_failing_since = None
        if answer.get("settled"):
            log.info("run %s settled %s", r.run_id, answer["settled"])
        return True

    # ---- small helpers -------------------------------------------------------------------------

    def _drain_file_changed(self) -> bool:
        """The drain file says something else than at the last tick (a held poll ends on it)."""
        if self._drain_file is None:
            return False
        try:
            return self._drain_file.read_text("utf-8").strip() != self._drain_file_text
        except FileNotFoundError:
            return self._drain_file_text is not None
        except OSError:
            return False

    def _read_drain_file(self) -> None:
        if self._drain_file is None:
            return
        try:
            text: str | None = self._drain_file.read_text("utf-8").strip()
        except FileNotFoundError:
            text = None
        except OSError as exc:
            log.warning("cannot read drain file %s: %s", self._drain_file, exc)
            return
        if text == self._drain_file_text:
            return  # only a change applies, so a signal's change holds until the file changes
        self._drain_file_text = text
        policy = self._start_drain if text is None else text
        if policy not in DRAIN_POLICIES:
            log.warning(
                "drain file %s: %r is not one of %s", self._drain_file, policy, DRAIN_POLICIES
            )
            return
        if self._stopping:
            return
        self._set_drain(policy)

    def _gave_up_stopping(self) -> bool:
        """Stopping, and the server has not answered (or not taken the kept result) for
        ``stop_grace`` seconds."""
        if not self._stopping:
            return False
        now = self.clock()
        return any(
            since is not None and now - since >= self.stop_grace
            for since in (self._down_since, self._result_failing_since)
        )

    def _keep_unreported(self, why: str) -> None:
        if self._unreported is not None:
            self._keep(self._unreported, why)
            self._unreported = None
            self._result_failing_since = None

    def _keep(self, r: _Report, why: str) -> Path | None:
        """Write a result the server did not take to ``keep_dir``; its path, or None."""
        if self._keep_dir is None:
            log.warning("result of %s/%s dropped (%s): no --keep-dir", r.run_id, r.seq, why)
            return None
        name = _SAFE_NAME.sub("_", f"{r.run_id}-{r.seq}-{r.attempt}").lstrip(".") + ".log"
        path = self._keep_dir / name
        try:
            self._keep_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            header = f"# run {r.run_id} step {r.seq} attempt {r.attempt}: {r.outcome}; {why}\n"
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write((header + (r.full or r.log)).encode("utf-8", "backslashreplace"))
        except OSError as exc:
            log.error("cannot keep the result of %s/%s in %s: %s", r.run_id, r.seq, path, exc)
            return None
        log.warning("result of %s/%s kept at %s (%s)", r.run_id, r.seq, path, why)
        return path

    def _note_failure(self, what: str, exc: ApiError) -> None:
        # One line when the server goes away, not one per poll.
        if isinstance(exc, Unreachable) or exc.status >= 500:
            if not self._down:
                log.warning("%s failed: %s (retrying)", what, exc)
                self._down_since = self.clock()
            self._down = True
        else:
            log.warning("%s failed: %s", what, exc)

    def _note_recovery(self) -> None:
        if self._down:
            log.info("the Mediator answers again")
            self._down = False
            self._down_since = None


_SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]")


class _NotNow(Exception):
    """This tick cannot go on (no answer, or the node is refused claims): idle, then retry."""


def _check_drain(policy: str) -> None:
    if policy not in DRAIN_POLICIES:
        raise ValueError(f"drain policy must be one of {DRAIN_POLICIES}, not {policy!r}")
