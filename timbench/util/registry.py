"""One registry type for every name -> thing table (kernel sets, algorithms, tasks, quant schemes, backends, ...).

A `Registry` is a dict (iteration, `in`, `len`, `", ".join(r)` work as before) plus what every table repeated on
its own: `lookup` with aliases and one error wording (`unknown kernel set 'exct'; did you mean 'exact'? valid:
exact, torch`), `register` as a decorator, `names` for listings, and names loaded from an entry-point group. The
wording lives here once, so every table answers a typo the same way.
"""

from __future__ import annotations

import difflib
import importlib.metadata
from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

T = TypeVar("T")


def did_you_mean(name: object, valid: Iterable[str], n: int = 1) -> str:
    """`"did you mean 'x'? "` (or `"did you mean 'x' or 'y'? "` with n > 1) for the valid names closest to `name`;
    "" when none is close (difflib's ratio >= 0.6) or `name` is not a string."""
    if not isinstance(name, str):
        return ""
    close = difflib.get_close_matches(name, list(valid), n=n)
    return f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""


class Registry(dict, Generic[T]):
    """Name -> T, in registration order.

    kind: what a name names, for the error ("kernel set", "task"); error: the exception type `lookup` raises
    (its argument is the one-line message); aliases: other names for registered ones (listed as valid too);
    valid_suffix: appended to the list of valid names (" or a checkpoint path"); valid_label: the word before
    that list; sort: list the names sorted, not in registration order; group: the entry-point group
    `load_entry_points` reads.
    """

    def __init__(
        self,
        kind: str,
        entries: dict[str, T] | None = None,
        *,
        error: Callable[[str], Exception] = ValueError,
        aliases: dict[str, str] | None = None,
        valid_suffix: str = "",
        valid_label: str = "valid",
        sort: bool = False,
        group: str | None = None,
    ):
        super().__init__(entries or {})
        self.kind, self.error, self.aliases = kind, error, dict(aliases or {})
        self.valid_suffix, self.valid_label, self.sort, self.group = valid_suffix, valid_label, sort, group

    def names(self) -> list[str]:
        """Registered names and aliases, in order or sorted (what the error lists as valid)."""
        names = [*self, *self.aliases]
        return sorted(names) if self.sort else names

    def register(self, name: str, value: T | None = None):
        """`reg.register(name, value)`, or `@reg.register(name)` on a class or function; a name registered twice
        to another value is an error (two plug-ins cannot silently shadow each other)."""

        def add(v: T) -> T:
            other = dict.get(self, name)
            if other is not None and other is not v:
                raise ValueError(f"{self.kind} name {name!r} registered twice ({_label(other)}, {_label(v)})")
            self[name] = v
            return v

        return add if value is None else add(value)

    def resolve(self, name: str) -> str:
        """The registered name `name` stands for (itself or what its alias points to)."""
        return self.aliases.get(name, name) if isinstance(name, str) else name

    def unknown(self, name: object, where: str = "") -> str:
        """The one-line message for a name that is not registered."""
        valid = ", ".join(self.names()) or "none"
        head = f"{where}: " if where else ""
        hint = did_you_mean(name, self.names())
        return f"{head}unknown {self.kind} {name!r}; {hint}{self.valid_label}: {valid}{self.valid_suffix}"

    def lookup(self, name: str, where: str = "") -> T:
        """The entry `name` (or its alias) names; `error(self.unknown(name))` otherwise."""
        try:
            return self[self.resolve(name)]
        except (KeyError, TypeError):  # TypeError: an unhashable name (a list from a YAML file)
            raise self.error(self.unknown(name, where)) from None

    def load_entry_points(self) -> dict[str, importlib.metadata.EntryPoint]:
        """The entry points of `group` by name (not loaded: loading runs a plug-in's code)."""
        if not self.group:
            return {}
        return {ep.name: ep for ep in importlib.metadata.entry_points(group=self.group)}


def _label(v: object) -> str:
    return getattr(v, "__name__", None) or repr(v)
