"""Bounded caches: every cache the runtime and its backends keep is an :class:`LRU`.

Plans, prepared launches, compiled programs (CUDA modules, OpenCL programs, JAX executables):
each is kept in an :class:`LRU` whose capacity is the ``cache_entries`` setting (default
:data:`DEFAULT_CAPACITY`), so a program that calls operators on ever new shapes keeps its memory
flat. The least recently used entry goes first; a hit costs one dict lookup and one move (no lock:
both are single C calls under the GIL; writers take a lock).

    compiled = LRU("cuda modules")          # a backend's compile cache
    mod = compiled.get(key)
    if mod is None:
        mod = compiled[key] = build(...)

Every LRU made is listed in :data:`CACHES` (weakly) so that ``opruntime.configure(cache_entries=...)``
resizes them all and ``opruntime info`` can show their sizes.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Hashable
from typing import Any

#: entries per cache unless the ``cache_entries`` setting says otherwise
DEFAULT_CAPACITY = 512
_capacity = [DEFAULT_CAPACITY]
#: every LRU made in this process (weakly held)
CACHES: weakref.WeakSet[LRU] = weakref.WeakSet()
_MISSING = object()


class LRU:
    """A thread-safe dict of at most ``capacity`` entries that evicts the least recently used.

    Args:
        name: what it holds, for ``opruntime info`` and messages.
        capacity: a fixed capacity; default: the ``cache_entries`` setting (resized with it).
    """

    __slots__ = ("__weakref__", "_data", "_fixed", "_lock", "_lookup", "_touch", "capacity", "name")

    def __init__(self, name: str, capacity: int | None = None) -> None:
        self.name = name
        self._fixed = capacity is not None
        self.capacity = capacity if capacity is not None else _capacity[0]
        self._data: OrderedDict[Hashable, Any] = OrderedDict()
        self._lookup, self._touch = self._data.get, self._data.move_to_end
        self._lock = threading.Lock()  # writers only: a lookup is two C calls, atomic under the GIL
        CACHES.add(self)

    def get(self, key: Hashable, default: Any = None) -> Any:
        """The value of ``key`` (made the most recent), else ``default``. Raises TypeError for an
        unhashable key, as a dict does. The hot path of every call: no lock."""
        value = self._lookup(key, _MISSING)
        if value is _MISSING:
            return default
        try:
            self._touch(key)
        except KeyError:  # evicted by another thread between the two calls: still a valid answer
            pass
        return value

    def __setitem__(self, key: Hashable, value: Any) -> None:
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.capacity:
                self._data.popitem(last=False)

    def __getitem__(self, key: Hashable) -> Any:
        value = self.get(key, _MISSING)
        if value is _MISSING:
            raise KeyError(key)
        return value

    def __contains__(self, key: Hashable) -> bool:
        return key in self._data

    def pop(self, key: Hashable, default: Any = None) -> Any:
        with self._lock:
            return self._data.pop(key, default)

    def __len__(self) -> int:
        return len(self._data)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()

    def resize(self, capacity: int) -> None:
        """Keep at most ``capacity`` entries from now on (the oldest go at once)."""
        with self._lock:
            self.capacity = capacity
            while len(self._data) > capacity:
                self._data.popitem(last=False)

    def __repr__(self) -> str:
        return f"LRU({self.name!r}, {len(self._data)}/{self.capacity})"


def set_capacity(capacity: int) -> None:
    """Resize every LRU that follows the setting (``cache_entries``), and those made later."""
    _capacity[0] = capacity
    for cache in list(CACHES):
        if not cache._fixed:
            cache.resize(capacity)
