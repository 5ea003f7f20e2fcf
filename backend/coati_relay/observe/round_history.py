"""`RoundHistory`: a run's round records, kept by column while the run goes (`RunRecorder`; the `RunResult` gets
them as a plain list of dicts at the end, which users index and serialise).

A round's record is a flat dict of about twenty numbers (plus a checkpoint path now and then). Kept as dicts, each
round costs the driver about 1.5 KiB (the dict, a float object per value); a run of a million rounds would hold 1.5 GB
while it runs. Here each number costs 8 bytes in a typed column (`array`), so the history of a long run stays small.
Reading a row builds its dict again, with the same keys in the same order and the same types.
"""
from __future__ import annotations

from array import array
from typing import Any, Dict, Iterable, Iterator, List, Sequence, Tuple, Union, overload

_TYPECODE = {float: "d", int: "q"}  # exact types only: a bool stays a bool (kept aside, as any other value)


class RoundHistory(Sequence[Dict[str, Any]]):
    """A sequence of record dicts: ``len``, indexing (``history[-1]["reward"]``), slices (lists of dicts), iteration,
    and ``==`` against any sequence of dicts. `append` adds a round.

    Storage: per key, one ``array('d')`` (floats) or ``array('q')`` (ints) with a slot for every row; a value whose
    type differs from its column's (a string, a bool, an int in a float column, ...) is kept aside by (row, key). Each
    row keeps the index of its key order, so rows with other keys or another order come back as they went in."""

    def __init__(self, records: Iterable[Dict[str, Any]] = ()) -> None:
        self._layouts: List[Tuple[str, ...]] = []
        self._layout_ids: Dict[Tuple[str, ...], int] = {}
        self._rows = array("L")  # the layout id of each row
        self._columns: Dict[str, array] = {}
        self._aside: Dict[Tuple[int, str], Any] = {}
        for record in records:
            self.append(record)

    def append(self, record: Dict[str, Any]) -> None:
        row = len(self._rows)
        keys = tuple(record)
        layout = self._layout_ids.setdefault(keys, len(self._layouts))
        if layout == len(self._layouts):
            self._layouts.append(keys)
        for key, value in record.items():
            column = self._columns.get(key)
            if column is None and type(value) in _TYPECODE:
                column = self._columns[key] = array(_TYPECODE[type(value)], bytes(8 * row))
            if column is None or _TYPECODE.get(type(value)) != column.typecode or not _fits(column, value):
                self._aside[row, key] = value
        for key, column in self._columns.items():
            value = record.get(key)
            column.append(value if (row, key) not in self._aside and key in record else 0)
        self._rows.append(layout)

    def _row(self, row: int) -> Dict[str, Any]:
        return {key: self._aside[row, key] if (row, key) in self._aside else self._columns[key][row]
                for key in self._layouts[self._rows[row]]}

    def __len__(self) -> int:
        return len(self._rows)

    @overload
    def __getitem__(self, index: int) -> Dict[str, Any]: ...

    @overload
    def __getitem__(self, index: slice) -> List[Dict[str, Any]]: ...

    def __getitem__(self, index: Union[int, slice]) -> Union[Dict[str, Any], List[Dict[str, Any]]]:
        if isinstance(index, slice):
            return [self._row(i) for i in range(*index.indices(len(self)))]
        n = len(self)
        if not -n <= index < n:
            raise IndexError(f"round history index {index} out of range ({n} rounds)")
        return self._row(index % n)

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        return (self._row(i) for i in range(len(self)))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, (str, bytes)):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other))

    def __repr__(self) -> str:
        return f"RoundHistory({list(self)!r})"

    @property
    def nbytes(self) -> int:
        """Bytes of the numeric columns (what grows by a row each round)."""
        return sum(c.itemsize * len(c) for c in self._columns.values()) + self._rows.itemsize * len(self._rows)


def _fits(column: array, value: Any) -> bool:
    """Whether an int fits an ``array('q')`` (a float always fits ``'d'``)."""
    return column.typecode != "q" or -(1 << 63) <= value < (1 << 63)
