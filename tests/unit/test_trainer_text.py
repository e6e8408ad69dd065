"""The trainer's one integer reader for the environment and its one first-line helper."""
from __future__ import annotations

import pytest

from ddptrainer.text import BadInteger, env_int, first_line

pytestmark = pytest.mark.unit


def test_env_int_reads_an_integer_and_falls_back_to_the_default_when_unset_or_empty():
    assert env_int({"N": "12"}, "N") == 12
    assert env_int({"N": "-3"}, "N", 5) == -3
    assert env_int({}, "N", 5) == 5 and env_int({"N": ""}, "N", 5) == 5
    assert env_int({}, "N") is None


@pytest.mark.parametrize("raw, minimum, message", [
    ("soon", None, "N='soon': must be an integer"),
    ("1.5", None, "N='1.5': must be an integer"),
    ("0", 1, "N='0': must be >= 1"),
])
def test_env_int_names_the_variable_and_what_is_allowed(raw, minimum, message):
    with pytest.raises(BadInteger) as caught:
        env_int({"N": raw}, "N", minimum=minimum)
    assert str(caught.value) == message
    assert (caught.value.name, caught.value.raw) == ("N", raw)
    assert env_int({"N": raw}, "N", 7, minimum=minimum, invalid=None) is None  # lenient readers


def test_first_line():
    assert first_line(RuntimeError("\n  boom\nTraceback ...")) == "boom"
    assert first_line(RuntimeError("")) == "RuntimeError"
    assert first_line("x" * 500) == "x" * 300
    assert first_line("abc\ndef", limit=2) == "ab"
    assert first_line("  ") == ""
