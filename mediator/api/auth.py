"""Bearer tokens → principal and role (docs/design.md §14).

A tokens file maps each token to a principal and one of the roles ``node``, ``client``,
``admin``::

    [[token]]
    token = "s3cret-node-1"
    principal = "lab-node-1"
    role = "node"

The development mode has no tokens and no principal (``''``, never NULL: design.md §14) and acts
as admin; ``mediator serve --dev`` refuses any host but loopback.
"""

from __future__ import annotations

import hmac
import json
import tomllib
from dataclasses import dataclass
from pathlib import Path

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


class Tokens:
    """The token table; ``None`` means development mode (no tokens at all)."""

    def __init__(self, table: dict[str, Principal] | None) -> None:
        self._table = table

    @property
    def dev(self) -> bool:
        return self._table is None

    @classmethod
    def load(cls, path: str | None) -> Tokens:
        if path is None:
            return cls(None)
        p = Path(path)
        try:
            text = p.read_text("utf-8")
        except OSError:
            raise ConfigError(
                f"The tokens file {path} cannot be read.", field="tokens_file"
            ) from None
        try:
            data = json.loads(text) if p.suffix == ".json" else tomllib.loads(text)
        except (ValueError, tomllib.TOMLDecodeError):
            raise ConfigError(
                "The tokens file is not valid TOML or JSON.", field="tokens_file"
            ) from None
        entries = data.get("token", []) if isinstance(data, dict) else []
        table: dict[str, Principal] = {}
        for i, e in enumerate(entries):
            if not isinstance(e, dict) or not all(
                isinstance(e.get(k), str) for k in ("token", "principal", "role")
            ):
                raise ConfigError(
                    f"token[{i}] needs token, principal and role strings.", field=f"token[{i}]"
                )
            if e["role"] not in ROLES:
                raise ConfigError(
                    f"token[{i}].role must be one of {', '.join(ROLES)}.", field=f"token[{i}].role"
                )
            if not e["principal"]:
                raise ConfigError(
                    f"token[{i}].principal must not be empty.", field=f"token[{i}].principal"
                )
            table[e["token"]] = Principal(e["principal"], e["role"])
        return cls(table)

    def resolve(self, header: str | None) -> Principal:
        """The caller for an ``Authorization`` header; 401 for a missing or unknown token."""
        if self._table is None:
            return DEV
        if not header or not header.startswith("Bearer "):
            raise Unauthorized("A bearer token is required (Authorization: Bearer <token>).")
        given = header[len("Bearer ") :].strip()
        for token, principal in self._table.items():
            if hmac.compare_digest(token.encode(), given.encode()):
                return principal
        raise Unauthorized("The bearer token is not known to this Mediator.")
