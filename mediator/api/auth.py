"""Bearer tokens → principal and role (docs/design.md §14).

A tokens file maps each token to a principal and one of the roles ``node``, ``client``,
``admin``::

    [[token]]
    token = "s3cret-node-1"
    principal = "lab-node-1"
    role = "node"

The development mode has no tokens and no principal (``''``, never NULL: design.md §14) and acts
as admin; ``mediator serve --dev`` refuses any host but loopback, and answers only to loopback
``Host`` names (mediator/api/guard.py).
"""

from __future__ import annotations

import hmac
import json
import stat
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mediator.core.errors import ConfigError, MediatorError

ROLES = ("node", "client", "admin")


class Unauthorized(MediatorError):
    status = 401
    code = "unauthorized"


@dataclass(frozen=True)
class Principal:
    """Who is calling. ``name`` is '' in development mode."""

    name: str
    role: str
    dev: bool = False

    @property
    def admin(self) -> bool:
        return self.role == "admin"


DEV = Principal("", "admin", dev=True)


MIN_TOKEN_BYTES = 16  # a shorter token can be guessed; docs/security.md "Tokens"


class Tokens:
    """The token table; ``None`` means development mode (no tokens at all).

    Loaded from a file that must be private to the server's account (no group or other
    permission) and whose tokens are each at least :data:`MIN_TOKEN_BYTES` bytes of visible
    ASCII, all different (issue 25 §2: an empty token matched a header that ``.strip()``
    reduced to nothing, and a repeated token silently made a client an admin).
    :meth:`reload` reads the file again (``SIGHUP``), keeping the table if the new file is bad.
    """

    def __init__(self, table: dict[str, Principal] | None, path: str | None = None) -> None:
        self._table = table
        self.path = path

    @property
    def dev(self) -> bool:
        return self._table is None

    @classmethod
    def load(cls, path: str | None) -> Tokens:
        if path is None:
            return cls(None)
        return cls(_read_table(path), path)

    def reload(self) -> str | None:
        """Read the tokens file again; the table changes only if the whole file is good.
        Returns the refusal's message (the old table stays), or ``None`` when reloaded."""
        if self.path is None:
            return None
        try:
            self._table = _read_table(self.path)
        except ConfigError as exc:
            return exc.message
        return None

    def resolve(self, header: str | None) -> Principal:
        """The caller for an ``Authorization`` header; 401 for a missing or unknown token.

        The token is the header's bytes after ``Bearer `` exactly — nothing is stripped, so a
        header holding a non-breaking space (0xA0) or a separator (0x1C, 0x85) is that byte,
        not an empty token — and it is compared with every known token in constant time."""
        table = self._table
        if table is None:
            return DEV
        if not header or not header.startswith("Bearer "):
            raise Unauthorized("A bearer token is required (Authorization: Bearer <token>).")
        try:
            given = header[len("Bearer ") :].encode("latin-1")  # the header's own bytes
        except UnicodeEncodeError:
            given = b""
        found: Principal | None = None
        for token, principal in table.items():
            if hmac.compare_digest(token.encode("ascii"), given) and given:
                found = principal
        if found is None:
            raise Unauthorized("The bearer token is not known to this Mediator.")
        return found


def _read_table(path: str) -> dict[str, Principal]:
    """The tokens file's table, or :class:`ConfigError` with one line naming what is wrong."""
    p = Path(path)
    try:
        mode = p.stat().st_mode
        text = p.read_text("utf-8")
    except (OSError, UnicodeDecodeError):
        raise ConfigError(f"The tokens file {path} cannot be read.", field="tokens_file") from None
    if mode & 0o077:
        raise ConfigError(
            f"The tokens file {path} is readable or writable by other accounts "
            f"(mode {stat.S_IMODE(mode):04o}); make it private: chmod 600 {path}.",
            field="tokens_file",
        )
    try:
        data = json.loads(text) if p.suffix == ".json" else tomllib.loads(text)
    except (ValueError, tomllib.TOMLDecodeError):
        raise ConfigError(
            "The tokens file is not valid TOML or JSON.", field="tokens_file"
        ) from None
    entries = data.get("token", []) if isinstance(data, dict) else []
    try:
        return _entries(entries)
    except ConfigError as exc:
        raise ConfigError(f"The tokens file {path}: {exc.message}", field=exc.field) from None


def _entries(entries: list[Any]) -> dict[str, Principal]:
    table: dict[str, Principal] = {}
    first: dict[str, int] = {}
    for i, e in enumerate(entries):
        if not isinstance(e, dict) or not all(
            isinstance(e.get(k), str) for k in ("token", "principal", "role")
        ):
            raise ConfigError(
                f"token[{i}] needs token, principal and role strings.", field=f"token[{i}]"
            )
        token = e["token"]
        if not token:
            raise ConfigError(f"token[{i}].token is empty.", field=f"token[{i}].token")
        if not all("!" <= c <= "~" for c in token):
            raise ConfigError(
                f"token[{i}].token must be visible ASCII characters only (no spaces or "
                "control characters).",
                field=f"token[{i}].token",
            )
        if len(token) < MIN_TOKEN_BYTES:
            raise ConfigError(
                f"token[{i}].token is {len(token)} bytes; a token needs at least "
                f"{MIN_TOKEN_BYTES} (make one with: openssl rand -hex 16).",
                field=f"token[{i}].token",
            )
        if token in first:
            raise ConfigError(
                f"token[{i}].token is the same as token[{first[token]}].token; "
                "every token must be different.",
                field=f"token[{i}].token",
            )
        if e["role"] not in ROLES:
            raise ConfigError(
                f"token[{i}].role must be one of {', '.join(ROLES)}.", field=f"token[{i}].role"
            )
        if not e["principal"]:
            raise ConfigError(
                f"token[{i}].principal must not be empty.", field=f"token[{i}].principal"
            )
        first[token] = i
        table[token] = Principal(e["principal"], e["role"])
    return table
