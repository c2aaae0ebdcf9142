"""Final-answer extraction and comparison for free-form math (GSM8K, MATH, DAPO).

Extraction (`extract_final_answer`) tries, in order: the last well-formed
`\\boxed{...}` / `\\fbox{...}` (balanced, nested braces; also `\\boxed 5`), the
last `#### ...` line (GSM8K; commas stripped), the last `Answer: ...` line
(DAPO's requested format). Comparison (`answers_match`) normalises both sides
conservatively (dollar signs, spacing macros, `\\left`/`\\right`, `\\dfrac` ->
`\\frac`, a `\\text{...}` unit after a number, degrees, percent, a leading
`x=`), then compares exact rational values when both parse as numbers
(`1/2` == `0.5` == `\\frac{1}{2}` == `\\dfrac12`, `1,000` == `1000`, `5.0` ==
`5`), falling back to string equality. Nothing here raises on any string.
"""

from __future__ import annotations

import re
from fractions import Fraction

_MAX_NUMBER_LEN = 64  # Fraction(str) of a huge literal would hit int()'s digit limit
_BOX = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")
_BARE_ARG = re.compile(r"[^\s${}]*")
_HASH = re.compile(r"####[ \t]*([^\n]*)")
_ANSWER_LINE = re.compile(r"(?im)^[ \t*]*answer[ \t*]*:[ \t*]*([^\n]*)")
_DECIMAL = re.compile(r"[+-]?(?:[0-9]{1,3}(?:,[0-9]{3})+|[0-9]+)(?:\.[0-9]*)?|[+-]?\.[0-9]+")
_SLASH = re.compile(r"([+-]?[0-9]+)/([0-9]+)")
_FRAC_ARG = r"(\{[^{}]*\}|[0-9])"
_FRAC = re.compile(r"([+-]?)\\frac" + _FRAC_ARG + _FRAC_ARG)
_TEXT_UNIT = re.compile(r"(.*?[0-9.}])\s*\\(?:text|mbox|mathrm)\{[^{}]*\}")
_WHOLE_TEXT = re.compile(r"\\(?:text|mbox|mathrm|textbf)\{([^{}]*)\}")
_VAR_PREFIX = re.compile(r"[a-zA-Z]\s*=\s*(?=\S)")


def _braced(text: str, start: int) -> str | None:
    """Content of the brace group opening at text[start] == '{', or None if unbalanced."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start + 1 : i]
    return None


def extract_boxed(text: str) -> str | None:
    """Content of the last well-formed `\\boxed{...}`, `\\fbox{...}` or `\\boxed x`."""
    if not isinstance(text, str):
        return None
    # Only the last few candidates: each unbalanced one scans to the end of the
    # text, so trying all of them would be quadratic on adversarial input.
    for m in list(_BOX.finditer(text))[::-1][:8]:
        i = m.end()
        while i < len(text) and text[i] == " ":
            i += 1
        if i < len(text) and text[i] == "{":
            content = _braced(text, i)
        else:
            # `\boxed 5`: the argument runs to the next space, `$` or brace.
            content = _BARE_ARG.match(text, i).group(0)
        if content is not None and content.strip():
            return content.strip()
    return None


def extract_hash_answer(text: str) -> str | None:
    """GSM8K's `#### 42` (last occurrence), commas removed."""
    if not isinstance(text, str):
        return None
    found = _HASH.findall(text)
    if not found:
        return None
    ans = found[-1].strip().replace(",", "").rstrip(".").strip()
    return ans or None


def extract_answer_line(text: str) -> str | None:
    """The last `Answer: ...` line, as DAPO-Math asks for."""
    if not isinstance(text, str):
        return None
    found = _ANSWER_LINE.findall(text)
    ans = found[-1].strip().rstrip(".").strip() if found else ""
    return ans or None


def extract_final_answer(text: str) -> str | None:
    return extract_boxed(text) or extract_hash_answer(text) or extract_answer_line(text)


def normalize_answer(s: str) -> str:
    """Conservative LaTeX/string normalisation (see module docstring)."""
    s = s.strip().strip("$").strip()
    boxed = extract_boxed(s)
    if boxed is not None and s.startswith(("\\boxed", "\\fbox")):
        s = boxed
    for macro in ("\\left", "\\right", "\\!", "\\,", "\\;", "\\:", "\\ ", "\\displaystyle"):
        s = s.replace(macro, "")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = s.replace("^{\\circ}", "").replace("^\\circ", "").replace("\\%", "").rstrip("%")
    m = _TEXT_UNIT.fullmatch(s)
    if m:  # "5\text{ cm}" -> "5"; only a unit *after* a number is dropped
        s = m.group(1)
    m = _WHOLE_TEXT.fullmatch(s.strip())
    if m:
        s = m.group(1)
    s = _VAR_PREFIX.sub("", s, count=1) if _VAR_PREFIX.match(s) else s
    s = s.replace(" ", "").strip("$").rstrip(".")
    return s


def parse_number(s: str) -> Fraction | None:
    """Exact value of a normalised decimal, `a/b` or `\\frac` literal, else None."""
    if not s or len(s) > _MAX_NUMBER_LEN:
        return None
    if _DECIMAL.fullmatch(s):
        return Fraction(s.replace(",", "").rstrip(".") or "0")
    m = _SLASH.fullmatch(s)
    if m:
        den = int(m.group(2))
        return Fraction(int(m.group(1)), den) if den else None
    m = _FRAC.fullmatch(s)
    if m:
        num, den = (parse_number(a.strip("{}")) for a in (m.group(2), m.group(3)))
        if num is None or den is None or den == 0:
            return None
        return -num / den if m.group(1) == "-" else num / den
    return None


def answers_match(pred: str | None, gold: str | None) -> bool:
    """True if `pred` and `gold` are the same answer after normalisation."""
    if not isinstance(pred, str) or not isinstance(gold, str):
        return False
    p, g = normalize_answer(pred), normalize_answer(gold)
    if not p or not g:
        return False
    vp, vg = parse_number(p), parse_number(g)
    if vp is not None and vg is not None:
        return vp == vg
    return p == g
