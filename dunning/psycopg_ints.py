"""Integers bound server-side arrive exact or are refused, never wrapped.

Django hands psycopg an int typed by the field it believes the value belongs to
(DatabaseOperations.integerfield_type_map: IntegerField -> Int4, SmallIntegerField -> Int2,
BigIntegerField -> Int8), and types a bare int in an expression (`F(total) + amount`,
`Value(amount)`) as IntegerField. Under server-side binding psycopg sends such a value in binary
by its declared width, and its C dumper packs it without a range check: 10**12 as Int4 arrives
as -727379968. Written client-side the same value is a literal, exact or refused by PostgreSQL.

These dumpers keep the declared width for a value that fits it (so prepared statements keep their
parameter types) and hand a value that does not fit to psycopg's own int dispatcher, which picks
int8 or numeric by value: a bigint column then gets the exact value, and a narrower column gets
PostgreSQL's "out of range" error, as client-side binding would.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.adapt import Dumper
from psycopg.pq import Format
from psycopg.types import numeric

_WIDTHS: tuple[tuple[type[int], int, type[Dumper], type[Dumper]], ...] = (
    (numeric.Int2, 16, numeric.Int2Dumper, numeric.Int2BinaryDumper),
    (numeric.Int4, 32, numeric.Int4Dumper, numeric.Int4BinaryDumper),
    (numeric.Int8, 64, numeric.Int8Dumper, numeric.Int8BinaryDumper),
)
_BY_VALUE = {Format.TEXT: numeric.IntDumper(int), Format.BINARY: numeric.IntBinaryDumper(int)}


def _range_checked(base: type[Dumper], bits: int) -> type[Dumper]:
    low, high = -(2 ** (bits - 1)), 2 ** (bits - 1)

    class RangeChecked(base):  # type: ignore[valid-type, misc]
        def get_key(self, obj: Any, format: Any) -> Any:
            if low <= obj < high:
                return self.cls
            # A key of its own: the bare class it widens to (Int8) is where psycopg caches the
            # plain dumper of that class, which would then serve a real Int8 unchecked.
            return (self.cls, _BY_VALUE[self.format].get_key(int(obj), format))

        def upgrade(self, obj: Any, format: Any) -> Dumper:
            if low <= obj < high:
                return self
            return _BY_VALUE[self.format].upgrade(int(obj), format)

    RangeChecked.__name__ = RangeChecked.__qualname__ = f"RangeChecked{base.__name__}"
    return RangeChecked


def register_range_checked_ints(adapters: psycopg.adapt.AdaptersMap | None = None) -> None:
    """On psycopg's global adapters (copied by every connection made afterwards) by default.
    Must run before Django opens its first connection: Django builds its adapters template
    from the global map once per process."""
    target = adapters if adapters is not None else psycopg.adapters
    for cls, bits, text_dumper, binary_dumper in _WIDTHS:
        target.register_dumper(cls, _range_checked(text_dumper, bits))
        target.register_dumper(cls, _range_checked(binary_dumper, bits))
