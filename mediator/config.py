"""Configuration (design.md §16): defaults that work on one machine, a TOML file, the environment.

Precedence for every setting: an explicit argument, then ``MEDIATOR_<NAME>`` in the environment,
then the configuration file, then the default. Values that cannot work are refused when the
configuration is built — in one place, :meth:`Config.validate`, whichever source they came from —
with a message naming the setting, so ``mediator serve`` can exit with status 2 before it listens.
Every number must be finite and inside ``RANGES`` (issue 11 §9: ``nan <= 0`` is false, so a bare
"> 0" test once let ``nan``, ``inf`` and ``1e-9`` through; docs/security.md lists the ranges).
"""

from __future__ import annotations

import dataclasses
import math
import os
import tomllib
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any, Final

from mediator.core.errors import ConfigError

# setting → (lowest, highest) allowed, both inclusive. Seconds from 0.1 s to a week: below that
# the reaper and adverts would spin; above it a lost node holds its lease for longer than anyone
# would wait. Counts from 1 to what a lab could ever have.
RANGES: Final[dict[str, tuple[float, float]]] = {
    "lease_ttl_seconds": (0.1, 604_800),
    "renew_seconds": (0.1, 604_800),
    "advert_ttl_seconds": (0.1, 604_800),
    "max_width": (1, 10_000),
    "max_attempts": (1, 1_000),
    "port": (0, 65_535),
    # /v1/events (issue 11 §2): a keepalive at least every 15 s; caps, total and per principal
    "events_keepalive_seconds": (0.01, 15),
    "events_max_streams": (1, 100_000),
    "events_max_streams_per_principal": (1, 100_000),
    # held work polls (docs/security.md "Held work polls"): the longest hold — below the enode's
    # 30 s request deadline and the ~30 s idle timeout of common proxies; 0 holds none — and caps
    "work_wait_max_seconds": (0, 25),
    "work_max_waits": (1, 100_000),
    "work_max_waits_per_principal": (1, 100_000),
    # mediator serve: uvicorn worker processes (issue 13); default the CPU count
    "workers": (1, 1_024),
    # fair under floods (docs/security.md): one principal's QUEUED runs and their needs classes
    "max_queued_runs_per_principal": (1, 100_000),
    "max_queued_classes_per_principal": (1, 100_000),
    # connections (docs/security.md "Connections"): from a connection's opening or last answer
    # to the end of the next request's head; below 0.1 s no real client could send one
    "request_head_timeout_seconds": (0.1, 3_600),
}
_WHOLE: Final = frozenset(
    {
        "max_width",
        "max_attempts",
        "port",
        "events_max_streams",
        "events_max_streams_per_principal",
        "work_max_waits",
        "work_max_waits_per_principal",
        "workers",
        "max_queued_runs_per_principal",
        "max_queued_classes_per_principal",
    }
)


def cpu_count() -> int:
    """The default number of ``mediator serve`` workers: one per CPU (issue 13)."""
    return os.cpu_count() or 1


@dataclass(frozen=True)
class Config:
    """Mediator settings. Construct directly, or with :meth:`load` from a file and environment."""

    database_url: str | None = None
    lease_ttl_seconds: float = 60.0
    renew_seconds: float = 10.0
    advert_ttl_seconds: float = 30.0
    max_width: int = 4
    max_attempts: int = 3
    wake_on_return: bool = True
    records_root: str | None = None
    tokens_file: str | None = None
    host: str = "127.0.0.1"
    port: int = 8640
    # /v1/events (issue 11 §2, docs/security.md "Event streams")
    events_keepalive_seconds: float = 15.0
    events_max_streams: int = 512
    events_max_streams_per_principal: int = 64
    # held work polls (docs/design.md §19 "The wake of a waiting node", docs/security.md)
    work_wait_max_seconds: float = 25.0
    # With the 512 event streams, a quarter of a process's 1,024 connections is left for the rest
    work_max_waits: int = 256
    work_max_waits_per_principal: int = 64
    # mediator serve: worker processes on one listening socket (docs/performance.md P1)
    workers: int = field(default_factory=cpu_count)
    # fair under floods (docs/security.md): a submit that would queue past either cap is 429
    max_queued_runs_per_principal: int = 1_000
    max_queued_classes_per_principal: int = 64
    # connections (docs/security.md "Connections"): a request head must arrive within this
    request_head_timeout_seconds: float = 10.0

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Refuse values that cannot work, naming the setting: the one check for every source.

        lease_ttl_seconds is checked by the promotion code too (R11): the value a user gives is
        refused here, but tests construct a Config with 0 through unchecked() to exercise R11.
        """
        for name, (low, high) in RANGES.items():
            value = getattr(self, name)
            whole = name in _WHOLE
            if whole:
                ok = isinstance(value, int) and not isinstance(value, bool)
                kind = "a whole number"
            else:
                ok = _number(value) and math.isfinite(value)
                kind = "a finite number of seconds"
            if not ok or not low <= value <= high:
                raise ConfigError(
                    f"{name} must be {kind} from {low:g} to {high:,g}, not {value!r}.", field=name
                )
        if not isinstance(self.wake_on_return, bool):
            raise ConfigError("wake_on_return must be true or false.", field="wake_on_return")
        if not isinstance(self.host, str) or not self.host:
            raise ConfigError("host must be a host name or address.", field="host")

    @classmethod
    def unchecked(cls, **values: Any) -> Config:
        """A Config that skips validation: only for tests of the code's own guards (R11)."""
        obj = object.__new__(cls)
        base = {
            f.name: f.default_factory() if f.default_factory is not MISSING else f.default
            for f in fields(cls)
        }
        base.update(values)
        for k, v in base.items():
            object.__setattr__(obj, k, v)
        return obj

    def replace(self, **changes: Any) -> Config:
        return dataclasses.replace(self, **changes)

    @classmethod
    def load(
        cls,
        path: str | os.PathLike[str] | None = None,
        env: dict[str, str] | None = None,
        **overrides: Any,
    ) -> Config:
        """File, then environment, then explicit overrides (``None`` overrides are ignored)."""
        env = dict(os.environ) if env is None else env
        values: dict[str, Any] = {}
        known = {f.name: f for f in fields(cls)}
        if path is not None:
            try:
                data = tomllib.loads(Path(path).read_text("utf-8"))
            except FileNotFoundError:
                raise ConfigError(
                    f"The configuration file {path} does not exist.", field="config"
                ) from None
            except tomllib.TOMLDecodeError as exc:
                raise ConfigError(
                    f"The configuration file is not valid TOML: {exc}.", field="config"
                ) from None
            data = data.get("mediator", data)
            for key, value in data.items():
                if key not in known:
                    raise ConfigError(
                        f"Unknown setting {key!r} in the configuration file.", field=key
                    )
                values[key] = value
        for name, f in known.items():
            raw = env.get("MEDIATOR_" + name.upper())
            if raw is not None:
                values[name] = _parse_env(name, raw, f.type)
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _parse_env(name: str, raw: str, typ: Any) -> Any:
    t = str(typ)
    try:
        if "bool" in t:
            low = raw.strip().lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
            raise ValueError(raw)
        if "int" in t:
            return int(raw)
        if "float" in t:
            return float(raw)
    except ValueError:
        raise ConfigError(
            f"MEDIATOR_{name.upper()}={raw!r} is not a valid value for {name}.", field=name
        ) from None
    return raw
