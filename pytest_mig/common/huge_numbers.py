"""Whether JSON text may hold a number too large for a pytest-mig file: a plain search that lets
the strict parser skip its per-number hooks on the text that holds none."""

from __future__ import annotations

#: Digits as "0", "E" as "e", "+" left out: a run of digits, or an exponent, is found by one plain search.
_DIGITS = bytes.maketrans(b"123456789E", b"000000000e")


def may_hold_huge(text: str) -> bool:
    """Whether ``text`` may hold a run of more than 20 digits or a positive exponent of three digits:
    only such text can hold an int or a float that :func:`pytest_mig.common.files.parse_json`'s number hooks
    refuses (20 digits under a 2-digit exponent stay finite; a negative exponent only underflows), so
    only such text is parsed through them.  A match elsewhere (inside a string) only costs the slower
    parse."""
    digits = text.encode("utf-8", "surrogatepass").translate(_DIGITS, b"+")
    if b"0" * 21 in digits:
        return True
    at = digits.find(b"0e000")
    while at >= 0:  # a number's exponent ends its token; a board's hex id ("...3e456b...") goes on
        end = at + 5
        while digits[end:end + 1] == b"0":
            end += 1
        if not digits[end:end + 1].isalnum() and digits[end:end + 1] != b"_":
            return True
        at = digits.find(b"0e000", end)
    return False


__all__ = ["may_hold_huge"]
