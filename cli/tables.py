"""Tables for people on the terminal, shared by the commands."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

from rich.console import OverflowMethod
from rich.table import Column, Table
from rich.text import Text


def titled_table(
    title: str,
    columns: Iterable[str],
    *,
    left: Collection[str] | None = None,
    overflow: OverflowMethod = "ellipsis",
) -> Table:
    """A table titled at its top left with these columns: the ones in `left` justified left and the others
    right, so that figures line up (without `left`, every column left); a cell too long for its column
    overflows as `overflow` says ("fold" keeps all of it)."""
    table = Table(title=title, title_justify="left")
    for name in columns:
        table.add_column(name, justify="left" if left is None or name in left else "right", overflow=overflow)
    return table


# ------------------------------------------------------------------------------ a query's result (`sql`)

ELISION = "…"  # stands for the columns left out of the middle, as in DuckDB's own CLI
VALUE_WIDTH = 20  # a squeezed column keeps this many characters a line of its values (longer ones wrap)


def _widest_line(text: Text) -> int:
    return max((line.cell_len for line in text.split("\n", allow_blank=True)), default=0)


@dataclass(frozen=True)
class ResultColumn:
    """One column of a query's result as shown: its name, its type, its cells in the rows shown."""

    name: str
    dtype: str
    cells: list[Text]

    @property
    def header(self) -> Text:
        return Text.assemble(self.name, "\n", (self.dtype, "dim"))

    @property
    def natural(self) -> int:
        """Its width with nothing wrapped."""
        return max(
            _widest_line(Text(self.name)), _widest_line(Text(self.dtype)), *map(_widest_line, self.cells)
        )

    @property
    def needed(self) -> int:
        """The least width that keeps its name and type whole and its values readable (wrapped, never cut)."""
        values = max(map(_widest_line, self.cells), default=0)
        return max(_widest_line(Text(self.name)), _widest_line(Text(self.dtype)), min(values, VALUE_WIDTH), 1)


def _frame_width(widths: Sequence[int]) -> int:
    """A table's width around columns this wide: a space either side of each, and the borders between."""
    return sum(widths) + 3 * len(widths) + 1


def _spread(columns: Sequence[ResultColumn], room: int) -> list[int]:
    """Column widths from what each needs, the room left over shared among those that want more."""
    widths = [c.needed for c in columns]
    wants = [c.natural for c in columns]
    spare = room - sum(widths)
    while spare > 0:
        wanting = [i for i, (width, want) in enumerate(zip(widths, wants, strict=True)) if width < want]
        if not wanting:
            break
        share = max(1, spare // len(wanting))
        for i in wanting:
            extra = min(share, wants[i] - widths[i], spare)
            widths[i] += extra
            spare -= extra
    return widths


def _kept_ends(columns: Sequence[ResultColumn], width: int) -> tuple[int, int]:
    """How many columns from the left and from the right fit beside one elision column: taken alternately,
    first from the left, until the next one would not fit (DuckDB's CLI does the same)."""
    left = right = 0
    used = [1]  # the elision column
    while left + right < len(columns):
        take_left = left <= right
        column = columns[left] if take_left else columns[len(columns) - 1 - right]
        if _frame_width([*used, column.needed]) > width:
            break
        used.append(column.needed)
        left, right = (left + 1, right) if take_left else (left, right + 1)
    return left, right


def result_table(columns: Sequence[ResultColumn], rows: int, width: int) -> tuple[Table | None, int]:
    """The table of a query's result (`rows` rows shown) for a terminal `width` characters wide, and how
    many of its columns it hides. As it is when it fits; else every column squeezed to what it needs; else
    the first and last columns that fit, with one "…" column between for those hidden; None when not even
    the first and the last fit beside it (then show the rows one block each: result_records)."""
    if _frame_width([c.natural for c in columns]) <= width:
        table = Table()
        for column in columns:
            table.add_column(column.header)
        for row in range(rows):
            table.add_row(*[c.cells[row] for c in columns])
        return table, 0
    if _frame_width([c.needed for c in columns]) <= width:
        left, right = len(columns), 0
    else:
        left, right = _kept_ends(columns, width)
        if left + right < 2:
            return None, len(columns)
    shown = [*columns[:left], *columns[len(columns) - right :]]
    hidden = len(columns) - len(shown)
    elision = 1 + 3 if hidden else 0  # its one character, its padding and a border
    widths = _spread(shown, width - _frame_width([0] * len(shown)) - elision)
    layout = [Column(c.header, width=w, overflow="fold") for c, w in zip(shown, widths, strict=True)]
    if hidden:
        layout.insert(left, Column(ELISION, width=1))
    table = Table(*layout)
    for row in range(rows):
        cells = [c.cells[row] for c in shown]
        table.add_row(*cells[:left], *([Text(ELISION)] if hidden else []), *cells[left:])
    return table, hidden


def result_records(columns: Sequence[ResultColumn], rows: int, width: int) -> list[Table]:
    """A query's result one block a row (`name type value` a line) for a terminal `width` characters wide,
    for when its columns cannot stand side by side; a result without rows gives one block naming its columns.
    Names and types keep up to half the width (longer ones fold); values fold in the rest."""
    names = min(max(_widest_line(Text(c.name)) for c in columns), max(width // 2, 1))
    types = min(max(_widest_line(Text(c.dtype)) for c in columns), max(width // 4, 1))
    blocks = []
    for row in range(max(rows, 1)):
        block = Table.grid(padding=(0, 1))
        block.title, block.title_justify = (f"row {row + 1}" if rows else "columns, no rows"), "left"
        block.add_column(width=names, overflow="fold")
        block.add_column(width=types, style="dim", overflow="fold")
        block.add_column(overflow="fold")
        for column in columns:
            block.add_row(Text(column.name), Text(column.dtype), column.cells[row] if rows else "")
        blocks.append(block)
    return blocks
