"""What evaluating a plan node gives: a scalar, a string, an instant vector or a range vector."""

from __future__ import annotations

from typing import Union

from .binops import Vec
from .columns import Window

Mat = list[Window]  # a range vector: one window per series
Result = Union[float, str, Vec, Mat]  # noqa: UP007 (runtime alias, py3.10)
