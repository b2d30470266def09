"""Shared helper of the validation tests (not a test module)."""

from __future__ import annotations

import pytest


def assert_raises_naming(thunk, exc, needles) -> BaseException:
    """``thunk()`` raises ``exc`` whose message contains every string of ``needles``;
    returns the exception."""
    with pytest.raises(exc) as info:
        thunk()
    msg = str(info.value)
    for needle in needles:
        assert needle in msg, f"{needle!r} missing from {type(info.value).__name__}: {msg}"
    return info.value
