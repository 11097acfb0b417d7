"""What a node does for an exec step: the ``uses`` of a step names an action here (design.md §19).

An action is a callable ``action(with_, ctx) -> Outcome``: ``with_`` is the step's ``with`` object
from the contract, ``ctx`` says which step this is and lets a long action keep the node's adverts
going (the lease that holds the node for the run is renewed only by adverts, design.md §10, so a
step that outlives ``lease_ttl`` without them would lose its run). It returns an :class:`Outcome`
— ``pass`` or ``fail`` with the step's output as the log — or raises :class:`Retry` to put the step
back to PENDING for another attempt. Any other exception is a ``fail`` whose log is the traceback:
the step's log is where its author looks, and the daemon must survive a broken action.

Built-ins: ``shell`` (``cmd``: a string for ``/bin/sh -c`` or a list of argv; optional
``timeout`` seconds), ``sleep`` (``seconds``) and ``fail`` (optional ``message``). More come from
installed packages through the entry-point group ``mediator.actions``; in a ``pyproject.toml``::

    [project.entry-points."mediator.actions"]
    flash = "mylab.actions:flash"

A plugin with a built-in's name is ignored (a log line says so): ``shell`` must mean the same thing
on every node of a fleet.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Final

log = logging.getLogger("mediator.enode")

ENTRY_POINT_GROUP: Final = "mediator.actions"
OUTCOMES: Final = ("pass", "fail", "retry")
# A step's log travels in the result's JSON body, and the server refuses oversized bodies (413).
# The end of the output is what explains a failure, so the head is what gets cut.
MAX_LOG_BYTES: Final = 64 * 1024
# How often a running shell step wakes up to let the daemon advertise; well under any sane
# advert_ttl/3, and cheap (one wait() call).
POLL_SLICE: Final = 0.5


class Retry(Exception):
    """Raise from an action to report ``retry``: the step returns to PENDING (docs/design.md §9).

    The message becomes the log. After ``max_attempts`` attempts the server fails the step instead.
    """


@dataclass(frozen=True)
class Outcome:
    """What an action reports.

    Attributes:
        outcome: ``"pass"``, ``"fail"`` or ``"retry"``.
        log: The step's output, stored by the Mediator as the step's log.
    """

    outcome: str
    log: str = ""

    def __post_init__(self) -> None:
        if self.outcome not in OUTCOMES:
            raise ValueError(f"outcome must be one of {OUTCOMES}, not {self.outcome!r}")


@dataclass
class Context:
    """The step an action runs for, and the hooks that keep the node alive meanwhile.

    Attributes:
        run_id: The run.
        seq: The step's position in the contract.
        name: The step's name.
        attempt: 1 for the first try, 2 after one ``retry``, …
        node_id: This node.
        instance: This daemon's instance id (fresh per start).
        heartbeat: Call at least every few seconds during long work: it advertises when due.
        sleep: Sleep this many seconds while heartbeating; use it instead of ``time.sleep``.
    """

    run_id: str
    seq: int
    name: str
    attempt: int
    node_id: str
    instance: str
    heartbeat: Callable[[], None] = field(default=lambda: None)
    sleep: Callable[[float], None] = field(default=time.sleep)

    def environ(self) -> dict[str, str]:
        """Variables a child process gets so a script can tell which step it is."""
        return {
            "MEDIATOR_RUN_ID": self.run_id,
            "MEDIATOR_STEP_SEQ": str(self.seq),
            "MEDIATOR_STEP_NAME": self.name,
            "MEDIATOR_ATTEMPT": str(self.attempt),
            "MEDIATOR_NODE_ID": self.node_id,
        }


Action = Callable[[Mapping[str, Any], Context], Outcome]


def step_environ(ctx: Context) -> dict[str, str]:
    """A step's environment: the daemon's, without any ``MEDIATOR_*`` variable of its own (the
    node's token, a token file's path — a step's output is a log other clients read, issue 25
    §3), plus the step's own ``MEDIATOR_*`` variables (:meth:`Context.environ`)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEDIATOR_")}
    return {**env, **ctx.environ()}


def _seconds(with_: Mapping[str, Any], key: str, *, required: bool) -> float | None:
    value = with_.get(key)
    if value is None and not required:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"`{key}` must be a number of seconds >= 0, not {value!r}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"`{key}` must be a number of seconds >= 0, not {value!r}")
    return float(value)


def shell(with_: Mapping[str, Any], ctx: Context) -> Outcome:
    """Run a command; exit status 0 passes, anything else fails. The log is stdout and stderr.

    ``with``: ``cmd`` (a string run by ``/bin/sh -c``, or a list of strings run as argv), optional
    ``timeout`` (seconds; the command's process group is killed when it passes).
    """
    given = with_.get("cmd")
    if isinstance(given, str) and given.strip():
        cmd: str | list[str] = given
    elif isinstance(given, list) and given and all(isinstance(c, str) for c in given):
        cmd = given
    else:
        return Outcome("fail", f"shell: `cmd` must be a string or a list of strings, not {given!r}")
    try:
        timeout = _seconds(with_, "timeout", required=False)
    except ValueError as exc:
        return Outcome("fail", f"shell: {exc}")
    with tempfile.TemporaryFile() as output:
        # Output goes to a file, not a pipe: a chatty command never blocks on a full pipe while
        # the daemon is busy advertising. A new session gives the command its own process group,
        # so a timeout kills its children too, and a Ctrl-C meant for the daemon (which finishes
        # the current step) does not reach the command.
        proc = subprocess.Popen(
            cmd,
            shell=isinstance(cmd, str),
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            env=step_environ(ctx),
            start_new_session=True,
        )
        started = time.monotonic()
        timed_out = False
        while True:
            try:
                status = proc.wait(timeout=POLL_SLICE)
                break
            except subprocess.TimeoutExpired:
                ctx.heartbeat()
                if timeout is not None and time.monotonic() - started >= timeout:
                    _kill_group(proc)
                    status = proc.wait()
                    timed_out = True
                    break
        output.seek(0)
        text = output.read().decode("utf-8", "replace")
    if timed_out:
        return Outcome("fail", text + f"\n[timed out after {timeout:g} s; killed]\n")
    if status == 0:
        return Outcome("pass", text)
    why = f"killed by signal {-status}" if status < 0 else f"exit status {status}"
    return Outcome("fail", text + f"\n[{why}]\n")


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):  # it ended between the last wait and now
        os.killpg(proc.pid, signal.SIGKILL)


def sleep(with_: Mapping[str, Any], ctx: Context) -> Outcome:
    """Wait ``seconds`` (advertising meanwhile), then pass."""
    try:
        seconds = _seconds(with_, "seconds", required=True)
    except ValueError as exc:
        return Outcome("fail", f"sleep: {exc}")
    assert seconds is not None
    ctx.sleep(seconds)
    return Outcome("pass", f"slept {seconds:g} s\n")


def fail(with_: Mapping[str, Any], ctx: Context) -> Outcome:
    """Always fail, with ``message`` as the log: for testing how a fleet handles failure."""
    return Outcome("fail", str(with_.get("message") or "the fail action always fails") + "\n")


BUILTINS: Final[Mapping[str, Action]] = {"shell": shell, "sleep": sleep, "fail": fail}


def load_actions(found: Iterable[EntryPoint] | None = None) -> dict[str, Action]:
    """The built-ins plus every action installed under the ``mediator.actions`` entry points.

    Args:
        found: Entry points to use instead of the installed ones (tests).

    Returns:
        ``{name: action}``. A plugin that fails to load is logged and left out, so one broken
        package costs the steps that use it (they fail as an unknown action), not the node.
    """
    actions: dict[str, Action] = dict(BUILTINS)
    for ep in entry_points(group=ENTRY_POINT_GROUP) if found is None else found:
        if ep.name in BUILTINS:
            log.warning(
                "plugin action %r (%s) ignored: a built-in has that name", ep.name, ep.value
            )
            continue
        try:
            loaded = ep.load()
        except Exception as exc:  # any import error of third-party code
            why = f"{type(exc).__name__}: {exc}"
            log.error("cannot load action %r from %s: %s", ep.name, ep.value, why)
            continue
        if not callable(loaded):
            log.error("action %r from %s is not callable", ep.name, ep.value)
            continue
        actions[ep.name] = loaded
    return actions


def escape_log(text: str) -> str:
    """A log every Mediator can store: NUL becomes the four characters ``\\x00`` and a lone
    surrogate its ``\\udcXX`` form; nothing else changes (docs/security.md "enode").

    PostgreSQL text cannot hold NUL and UTF-8 cannot encode a lone surrogate, so either in a
    result once made the server refuse it; a step's output is the step's, so it is escaped here
    rather than lost.
    """
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def truncate(text: str, limit: int = MAX_LOG_BYTES) -> str:
    """Keep the last ``limit`` bytes of a log (UTF-8), with a line saying how much was cut."""
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text
    tail = data[-limit:].decode("utf-8", "ignore")
    return f"[… {len(data) - limit} bytes cut …]\n{tail}"
