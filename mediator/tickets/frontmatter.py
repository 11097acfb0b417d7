"""The frontmatter block of a ticket file, edited line by line so a person's text survives.

Why line by line: people write these files by hand (tickets.md §2) and the engine adds and removes
its own keys. Re-serialising through a YAML library would reorder keys, drop comments and reformat
values a person chose. A ``Document`` is therefore the frontmatter as a list of entries – the raw
lines of one key, or one stray line such as a comment – plus the body, kept byte for byte. Setting
a key replaces only that key's lines; unknown keys and everything else are left exactly as written.

Values use the small YAML subset tickets need: plain scalars, quoted scalars (``"double"`` with
JSON escapes, ``'single'``), flow lists ``[a, b]`` and block lists (``- a`` lines under the key).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace

Value = str | list[str]

_FENCE = "---"
_KEY = re.compile(r"^(?P<key>[A-Za-z_][A-Za-z0-9_.-]*)[ \t]*:(?:[ \t]+|$)(?P<rest>.*)$", re.DOTALL)
_ITEM = re.compile(r"^[ \t]*-(?:[ \t]+(?P<item>.*))?$")
# A plain scalar we may write unquoted: it reads back as the same string in YAML and in parse().
_PLAIN = re.compile(r"^[^\s\-?:,\[\]{}#&*!|>'\"%@`][^\n\r\t]*$")
_NOT_PLAIN_WORDS = {"true", "false", "yes", "no", "on", "off", "null", "~", ""}
_NUMBER = re.compile(r"^[-+]?(?:\d[\d_]*(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?$|^0[xob]")


@dataclass(frozen=True)
class Entry:
    """One key's raw lines (``key`` set) or one line that belongs to no key (``key`` is None)."""

    key: str | None
    lines: tuple[str, ...]


@dataclass(frozen=True)
class Document:
    """A ticket file: frontmatter entries and the body, exactly as read unless edited.

    Attributes:
        entries: The frontmatter, in file order.
        body: Everything after the closing ``---`` line, verbatim.
        fenced: Whether the file had a frontmatter block at all.
    """

    entries: tuple[Entry, ...]
    body: str
    fenced: bool = True

    @classmethod
    def parse(cls, text: str) -> Document:
        """Splits ``text`` into frontmatter entries and body; never fails.

        A file that does not open with a ``---`` line, or never closes it, is all body.
        """
        lines = _split_lines(text)
        if not lines or lines[0].rstrip("\r\n") != _FENCE:
            return cls((), text, fenced=False)
        for end in range(1, len(lines)):
            if lines[end].rstrip("\r\n") in (_FENCE, "..."):
                break
        else:
            return cls((), text, fenced=False)
        entries: list[Entry] = []
        for line in lines[1:end]:
            match = _KEY.match(line.rstrip("\r\n"))
            continues = line[:1] in (" ", "\t") or (_ITEM.match(line.rstrip("\r\n")) is not None)
            if match:
                entries.append(Entry(match["key"], (line,)))
            elif continues and entries and entries[-1].key is not None:
                entries[-1] = Entry(entries[-1].key, (*entries[-1].lines, line))
            else:
                entries.append(Entry(None, (line,)))
        fence = (lines[0], lines[end])
        return cls(
            (Entry(None, (fence[0],)), *entries, Entry(None, (fence[1],))),
            "".join(lines[end + 1 :]),
        )

    def render(self) -> str:
        """The file text; equals the parsed text when nothing was edited."""
        return "".join(line for entry in self.entries for line in entry.lines) + self.body

    def key_order(self) -> list[str]:
        """The keys in file order (a repeated key is listed once; the last one wins)."""
        seen: dict[str, None] = {}
        for entry in self.entries:
            if entry.key is not None:
                seen[entry.key] = None
        return list(seen)

    def get(self, key: str) -> Value | None:
        """The value of ``key``: a string, a list of strings, or None when absent."""
        found = [entry for entry in self.entries if entry.key == key]
        return _value(found[-1]) if found else None

    def get_str(self, key: str) -> str | None:
        """The value of ``key`` as a string; None when absent, empty or a list."""
        value = self.get(key)
        return value if isinstance(value, str) and value != "" else None

    def get_list(self, key: str) -> list[str]:
        """The value of ``key`` as a list; a lone scalar becomes a one-item list."""
        value = self.get(key)
        if value is None or value == "":
            return []
        return [value] if isinstance(value, str) else value

    def set(self, key: str, value: Value | int) -> Document:
        """A copy with ``key`` set; its lines replace the old ones in place, or go last."""
        line = f"{key}: {render_value(value)}\n"
        entries = list(self.entries) if self.fenced else [Entry(None, ("---\n",))]
        positions = [i for i, entry in enumerate(entries) if entry.key == key]
        if positions:
            entries[positions[-1]] = Entry(key, (line,))
            entries = [e for i, e in enumerate(entries) if i not in positions[:-1]]
        else:
            # New keys go just before the closing fence, after everything a person wrote.
            entries.insert(len(entries) - 1 if self.fenced else len(entries), Entry(key, (line,)))
        if not self.fenced:
            entries.append(Entry(None, ("---\n",)))
        return replace(self, entries=tuple(entries), fenced=True)

    def remove(self, *keys: str) -> Document:
        """A copy without ``keys`` (their continuation lines go too); all else is untouched."""
        return replace(self, entries=tuple(e for e in self.entries if e.key not in keys))

    def with_body(self, body: str) -> Document:
        """A copy with a new body."""
        return replace(self, body=body)


def _split_lines(text: str) -> list[str]:
    """Lines ending in ``\n`` only (``str.splitlines`` also breaks at form feeds and U+2028)."""
    parts = text.split("\n")
    return [part + "\n" for part in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


def render_value(value: Value | int) -> str:
    """Writes a value so that ``parse`` (and YAML) read back exactly ``value``."""
    if isinstance(value, bool):
        raise TypeError("booleans are not frontmatter values here")
    if isinstance(value, int):
        return str(value)
    if isinstance(value, list):
        return "[" + ", ".join(_render_scalar(item, in_flow=True) for item in value) + "]"
    return _render_scalar(value, in_flow=False)


def _render_scalar(text: str, *, in_flow: bool) -> str:
    plain = (
        _PLAIN.match(text) is not None
        and text.isprintable()
        and text == text.strip()
        and text.lower() not in _NOT_PLAIN_WORDS
        and not _NUMBER.match(text)
        and ": " not in text
        and " #" not in text
        and not text.endswith(":")
        and not (in_flow and any(c in text for c in ",[]{}"))
    )
    # JSON escapes are valid YAML double-quoted escapes; non-printable characters are escaped
    # (ensure_ascii) so no reader mistakes them for line breaks.
    return text if plain else json.dumps(text, ensure_ascii=not text.isprintable())


def _value(entry: Entry) -> Value:
    first = entry.lines[0].rstrip("\r\n")
    match = _KEY.match(first)
    rest = match["rest"].strip() if match else ""
    if rest == "":
        items = [_ITEM.match(line.rstrip("\r\n")) for line in entry.lines[1:]]
        found = [m["item"] or "" for m in items if m is not None]
        if found:
            return [_scalar(item.strip()) for item in found]
        return _scalar(" ".join(_continuation(entry)))
    if rest.startswith("["):
        return _flow_list(rest)
    if not rest.startswith(("'", '"')):
        rest = " ".join([rest, *_continuation(entry)])
    return _scalar(rest)


def _continuation(entry: Entry) -> list[str]:
    """The stripped continuation lines of a folded plain scalar, comments left out."""
    stripped = (line.strip() for line in entry.lines[1:])
    return [line for line in stripped if line and not line.startswith("#")]


def _scalar(text: str) -> str:
    if text.startswith('"'):
        decoded, _ = _decode_double(text)
        return decoded
    if text.startswith("'"):
        return _decode_single(text)[0]
    comment = re.search(r"[ \t]#", text)
    return (text[: comment.start()] if comment else text).strip()


def _decode_single(text: str) -> tuple[str, int]:
    """Decodes the single-quoted scalar at the start of ``text`` (``''`` is a quote)."""
    end = 1
    while end < len(text):
        if text[end] == "'":
            if text[end + 1 : end + 2] != "'":
                return text[1:end].replace("''", "'"), end + 1
            end += 2
        else:
            end += 1
    return text[1:].replace("''", "'"), len(text)


def _decode_double(text: str) -> tuple[str, int]:
    """Decodes the double-quoted scalar at the start of ``text``; returns it and its length."""
    i = 1
    while i < len(text):
        if text[i] == "\\":
            i += 2
            continue
        if text[i] == '"':
            try:
                return json.loads(text[: i + 1]), i + 1
            except json.JSONDecodeError:
                return text[1:i], i + 1
        i += 1
    return text[1:], len(text)


def _flow_list(text: str) -> list[str]:
    items: list[str] = []
    i, current = 1, ""
    while i < len(text):
        char = text[i]
        if char in "\"'" and current.strip() == "":
            if char == '"':
                decoded, length = _decode_double(text[i:])
                current, i = "\0" + decoded, i + length
            else:
                decoded, length = _decode_single(text[i:])
                current, i = "\0" + decoded, i + length
            continue
        if char in ",]":
            if current.strip():
                items.append(current[1:] if current.startswith("\0") else current.strip())
            current = ""
            if char == "]":
                break
        elif not current.startswith("\0"):
            current += char
        i += 1
    return items
