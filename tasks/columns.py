"""The column-wise worked format shared by the addition and multiplication tasks.

A response lists one two-digit value per column, least significant column
first, separated by spaces; each value's tens digit is the carry into the next
column and its units digit is the answer digit of that column. Then `#` and the
answer digits *least significant first* (the column units digits in order, then
the final carry if non-zero). Writing digits in the order they are computed is
what makes the format learnable by a tiny model: every output digit depends
only on tokens already written. `extract_answer` reverses the digits back.

    1234+5678=  ->  12 11 09 06#2196      (answer 6912)
"""

from __future__ import annotations

import re

from .base import is_canonical_int, text_after_last

MARKER = "#"
_DIGITS = re.compile(r"[0-9]{1,64}")


def digits_lsd(x: int, width: int) -> list[int]:
    """The `width` lowest decimal digits of x >= 0, least significant first."""
    return [(x // 10**i) % 10 for i in range(width)]


def render(column_values: list[int], final_carry: int) -> str:
    """`"12 11 09 06#2196"` from the column values and the carry out of the top column."""
    reversed_answer = "".join(str(v % 10) for v in column_values) + (str(final_carry) if final_carry else "")
    return " ".join(f"{v:02d}" for v in column_values) + MARKER + reversed_answer


def extract_reversed(response: str) -> str | None:
    """The answer written after the last `#` (LSD first), in normal order; None
    unless it is a canonical non-negative integer (so `06912` is not `6912`)."""
    tail = text_after_last(response, MARKER)
    if tail is None or _DIGITS.fullmatch(tail) is None:
        return None
    answer = tail[::-1]
    return answer if is_canonical_int(answer) else None
