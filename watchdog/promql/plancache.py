"""Compiled plans kept between queries, bounded by how much they hold as well as by how many there are."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class WeightedCache(Generic[K, V]):
    """A least-recently-used cache holding at most `max_entries` values whose weights sum to `max_weight`."""

    def __init__(self, max_entries: int, max_weight: int) -> None:
        self.max_entries = max_entries
        self.max_weight = max_weight
        self.weight = 0
        self._items: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._lock = threading.Lock()  # a rule reload may compile on a thread while the loop queries

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: K) -> V | None:
        """The value kept for key (now the most recently used), or None."""
        with self._lock:
            item = self._items.get(key)
            if item is None:
                return None
            self._items.move_to_end(key)
            return item[0]

    def put(self, key: K, value: V, weight: int) -> None:
        """Keep value, dropping the least recently used values until both bounds hold."""
        if weight > self.max_weight:
            return
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self.weight -= old[1]
            self._items[key] = (value, weight)
            self.weight += weight
            while len(self._items) > self.max_entries or self.weight > self.max_weight:
                _, (_, dropped) = self._items.popitem(last=False)
                self.weight -= dropped
