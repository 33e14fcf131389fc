"""One registry for everything cptkit looks up by name: steps, config schemas and plugins (LLM
backends, mixture controllers, classifier backends, evaluation tasks).

A :class:`Registry` maps a name to an object. Built-in entries register themselves where they are
defined (``@REG.register("name")``); a user's own class is named ``package.module:Class`` in the
config and loaded by :meth:`Registry.get`, which checks it against the registry's ``base``::

    CONTROLLERS: Registry[type[Controller]] = Registry("train.mixture", base=Controller)

    @CONTROLLERS.register("velocitune")
    class Velocitune(Controller): ...

    CONTROLLERS.get("velocitune")                  # the built-in class
    CONTROLLERS.get("my_pkg.mixtures:MyController")  # a plugin, imported once and checked
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

from cptkit.core.errors import CptkitError

T = TypeVar("T")


def load_plugin(spec: str, key: str, base: type | None = None) -> Any:
    """Import ``package.module:Name`` for the setting ``key``; one line naming ``key`` if it fails or
    if ``Name`` is not a subclass of ``base``."""
    mod, sep, name = spec.partition(":")
    if not sep or not mod or not name:
        raise CptkitError(f"{key}={spec}: expected a registered name or package.module:Name")
    try:
        obj = getattr(importlib.import_module(mod), name)
    except (ImportError, AttributeError) as e:
        raise CptkitError(f"{key}={spec}: cannot import {name} from {mod} ({e})") from None
    if base is not None and not (isinstance(obj, type) and issubclass(obj, base)):
        raise CptkitError(f"{key}={spec}: {name} is not a {public_name(base)} subclass")
    return obj


def public_name(cls: type) -> str:
    """``cls``'s dotted name as users import it: the shortest loaded package path that exports it
    (``cptkit.llm.Generator``, defined in ``cptkit.llm.base``)."""
    parts = cls.__module__.split(".")
    for i in range(1, len(parts) + 1):
        mod = sys.modules.get(".".join(parts[:i]))
        if mod is not None and getattr(mod, cls.__qualname__, None) is cls:
            return f"{'.'.join(parts[:i])}.{cls.__qualname__}"
    return f"{cls.__module__}.{cls.__qualname__}"


def _origin(obj: Any) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', type(obj).__qualname__)}"


class Registry(Generic[T]):
    """Names to objects of one kind. ``key`` is the setting that names them (for error lines);
    ``base``, when given, is the class a plugin must subclass. ``origin``, when given, says where an
    entry was declared (a step: its module): a name declared again from the same origin (the module
    imported again) replaces the entry, from another origin is an error naming both."""

    def __init__(self, key: str, base: type | None = None, *, origin: Callable[[Any], str] | None = None):
        # where an entry comes from: the same name again from the same place (a module imported twice) replaces it
        self.key, self.base, self.origin = key, base, origin or _origin
        self._entries: dict[str, T] = {}

    def register(self, name: str, obj: T | None = None) -> Any:
        """``REG.register("name", obj)``, or ``@REG.register("name")`` as a decorator. Registering
        a name twice with a different object is an error (two plugins would shadow each other)."""
        def add(o: T) -> T:
            old = self._entries.get(name)
            if old is not None and self.origin(old) != self.origin(o):
                raise CptkitError(f"{self.key} {name!r} is declared twice: in {self.origin(old)} and in "
                                  f"{self.origin(o)}")
            self._entries[name] = o
            return o
        return add(obj) if obj is not None else add

    def get(self, name: str) -> T:
        """The entry called ``name``, or the plugin ``package.module:Name``."""
        if name in self._entries:
            return self._entries[name]
        if ":" in name:
            return load_plugin(name, self.key, self.base)
        known = ", ".join(sorted(self._entries)) or "none"
        raise CptkitError(f"{self.key}={name}: unknown (known: {known}; or package.module:Name)")

    def unregister(self, name: str) -> None:
        """Forget ``name`` (a plugin whose directory is gone again); no error when it is unknown."""
        self._entries.pop(name, None)

    def find(self, name: str) -> T | None:
        """The registered entry called ``name``, or None (plugins are not loaded)."""
        return self._entries.get(name)

    def names(self) -> list[str]:
        """The registered names, in registration order."""
        return list(self._entries)

    def items(self) -> Iterator[tuple[str, T]]:
        return iter(list(self._entries.items()))

    def __iter__(self) -> Iterator[str]:
        """The registered names, in registration order (``", ".join(REG)`` for an error line)."""
        return iter(list(self._entries))

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __len__(self) -> int:
        return len(self._entries)

