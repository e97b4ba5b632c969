"""A memo created per search and passed down to the estimates it runs.

Within one search the model, cluster and request are fixed, so a key needs only the
configuration values that vary (tp, micro-batch, ...). Nothing here is global: a new
search starts with a new, empty memo, and the cost functions it wraps stay pure.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import TypeVar

T = TypeVar("T")


class Memo:
    """compute() once per key for the life of one search."""

    def __init__(self) -> None:
        self._values: dict[Hashable, object] = {}

    def get(self, key: Hashable, compute: Callable[..., T], *args: object) -> T:
        """The value for key, computed as compute(*args) the first time (arguments instead
        of a closure: the training search asks hundreds of thousands of times)."""
        try:
            return self._values[key]  # type: ignore[return-value]
        except KeyError:
            value = self._values[key] = compute(*args)
            return value
