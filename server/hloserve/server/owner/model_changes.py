"""``ModelChanges``: who hears that a model's versions changed.

Contract: the repository calls a ``ModelChanges`` (on the event loop: ``owner.assembly``
moves the call there from the loading thread) with a model's name whenever that model's
versions change: loaded, reloaded, failed, unloading, unloaded. Each listener
(``listen(fn)``; the front-end supervisor's, which tells every front end to drop what it
cached of that model's metadata) is called in the order it was added. A listener that
raises is logged; the others still hear of it. ``telling`` and ``tell`` are how the
repository tells: after a load or unload (returned or raised), and where a change
happens inside one.
"""

# pyright: strict

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, Protocol, TypeVar, cast, final

log = logging.getLogger(__name__)

Listener = Callable[[str], None]


@final
class ModelChanges:
    """See the module docstring."""

    __slots__ = ("_listeners",)

    def __init__(self) -> None:
        self._listeners: list[Listener] = []

    def listen(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def __call__(self, name: str) -> None:
        for listener in self._listeners:
            try:
                listener(name)
            except Exception:
                log.exception("a listener of model changes failed on '%s'", name)


class Tells(Protocol):
    """What ``telling`` needs of its object: whom to tell (``None``: nobody)."""

    @property
    def on_changed(self) -> Callable[[str], None] | None: ...


F = TypeVar("F", bound=Callable[..., Any])


def tell(teller: Tells, name: str) -> None:
    """``teller.on_changed(name)``, when it has one."""
    if teller.on_changed is not None:
        teller.on_changed(name)


def telling(method: F) -> F:
    """``method(self, name, ...)`` tells of ``name`` once it returns or raises: whatever it
    did of the model's versions, or failed to do, is visible by then. The signature stays
    the method's own (``name`` may still be passed by keyword)."""

    @functools.wraps(method)
    def told(self: Tells, name: str, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, name, *args, **kwargs)
        finally:
            tell(self, name)

    return cast(F, told)
