"""Name -> factory registries: how the congestion controllers and the path policies are chosen by name.

In the shape of aioquic's congestion-control registry (`register_congestion_control`): each built-in
registers itself under its name with a one-line summary, and everything that lists or checks names
(the configuration's validation, the command line's choices and help, error messages) asks the
registry, so a new controller or policy is one new module plus one `register` line.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

F = TypeVar("F")


@dataclass(frozen=True)
class Entry(Generic[F]):
    factory: F
    summary: str


class Registry(Generic[F]):
    """Factories by name, in the order they were registered; `what` names the kind in error messages."""

    def __init__(self, what: str) -> None:
        self.what = what
        self._entries: dict[str, Entry[F]] = {}

    def register(self, name: str, factory: F, summary: str) -> None:
        if not name or not name.replace("-", "").replace("_", "").isalnum():
            raise ValueError(f"{self.what} name {name!r}: use letters, digits, '-' or '_'")
        if name in self._entries:
            raise ValueError(f"{self.what} {name!r} is registered already")
        self._entries[name] = Entry(factory, summary)

    def unregister(self, name: str) -> None:
        del self._entries[name]

    def get(self, name: str) -> F:
        """The factory of `name`, or a ValueError that lists the names there are."""
        entry = self._entries.get(name)
        if entry is None:
            raise ValueError(f"unknown {self.what} {name!r}: use {self.choices_text()}")
        return entry.factory

    def names(self) -> tuple[str, ...]:
        return tuple(self._entries)

    def choices_text(self) -> str:
        """'a, b or c'."""
        names = self.names()
        return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"

    def help(self) -> str:
        """'a: summary; b: summary' for a command's --help."""
        return "; ".join(f"{name}: {entry.summary}" for name, entry in self._entries.items())

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)
