"""A deterministic error: the same error, before the attempt trained, on attempts in a row (pure).

Bad luck (a node that died, a port taken, a filesystem that hiccuped) seldom repeats word for
word; a bug does (a typo, an argument the script does not know, a shape that does not fit the
first forward): every attempt fails the same way within seconds, and a restart budget of 3
prints the same traceback four times on every rank. ``failurePolicy.repeatedErrorAttempts``
(default 2: restart once) fails the job instead, with the error named once (reason
``RepeatedError``).

What counts, kept narrow so that bad luck still restarts:

* the error is the Python exception a failure's termination message names
  (``error_of``: "ZeroDivisionError: division by zero (train.py:12 in main)"; ``ddptrain-pod``
  writes the worker's, the kubelet's FallbackToLogsOnError the log tail of a command of one's
  own); a wrapper's (torchrun's ChildFailedError, mp.spawn's ProcessExitedException) is no
  error of its own, and a message naming none has no error: it never counts;
* of an exit of the code's own: an exit code under 128 that is not a consequence of another
  failure (143, 12, 13: a peer lost, a rendezvous timed out); no signal, eviction, stall or
  disruption;
* before the attempt trained (``failed_before_training``): it reported no progress, and either
  an earlier attempt did (the program reports, so its silence is news) or it failed within
  ``EARLY_FAILURE_SECONDS`` of its start;
* the same, digits aside (``same``: a rank, a port, an address, a time differ between attempts).

The operator (controller/policy/failure.py, from status.failureHistory[].error) and
``ddpjob run`` (local/runner.py) both judge with ``repeated``.
"""
from __future__ import annotations

import re
from typing import Iterable, Optional

from ddpjob import contract
from ddpjob.api.status import FAILURE_ERROR_LIMIT, shorten

#: The most characters of an error kept (status.failureHistory[].error): enough to tell two
#: errors apart, bounded whatever a pod writes.
ERROR_LIMIT = FAILURE_ERROR_LIMIT
#: A program that reports no progress failed "before training" if it failed this soon after its
#: attempt started: a typo or a bad argument fails in seconds, an import of torch in tens.
EARLY_FAILURE_SECONDS = 300
#: Reason of a job failed by a repeated error.
REPEATED_ERROR = "RepeatedError"

# "ZeroDivisionError: ...", "torch.OutOfMemoryError: ...", "mymod.ConfigError" (a module path,
# then a CamelCase name ending in Error or Exception, then a colon or the end).
_EXCEPTION = re.compile(r"(?<![\w.])((?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception))(?::[ \t]*([^\n]*)|(?=\s*$))",
                        re.MULTILINE)
#: Exceptions that only carry another process's failure: no error of their own.
_WRAPPERS = frozenset({"ChildFailedError", "ProcessExitedException", "ProcessRaisedException", "BrokenProcessPool"})
# What ddptrain-pod appends after the worker's words: how many other workers failed.
_OTHERS = re.compile(r"\s*\[\d+ other worker\(s\) failed too\]\s*$")
_DIGITS = re.compile(r"\d+")


def error_of(message: str) -> str:
    """The last Python exception ``message`` names, as "Type: what it said" (at most
    ERROR_LIMIT characters), or "" when it names none of its own."""
    found = ""
    for match in _EXCEPTION.finditer(message or ""):
        name, said = match.group(1), (match.group(2) or "").strip()
        if name.rsplit(".", 1)[-1] in _WRAPPERS:
            continue
        said = _OTHERS.sub("", said)
        found = f"{name}: {said}" if said else name
    return shorten("".join(ch for ch in found if ch.isprintable()), ERROR_LIMIT)


def counts(exit_code: Optional[int]) -> bool:
    """Whether a failure with this exit code can be a deterministic error: an exit of the
    code's own, not a signal and not a consequence of another failure."""
    return exit_code is not None and 0 < exit_code < 128 and exit_code not in contract.CONSEQUENCE_EXIT_CODES


def failed_before_training(*, reported: bool, ever_reported: bool, seconds_since_start: Optional[float]) -> bool:
    """``reported``: the failed attempt reported progress; ``ever_reported``: an earlier one did;
    ``seconds_since_start``: from the attempt's start to its failure (None: unknown)."""
    if reported:
        return False
    if ever_reported:
        return True
    return seconds_since_start is not None and seconds_since_start <= EARLY_FAILURE_SECONDS


def same(a: str, b: str) -> bool:
    """The same error, digits aside (ranks, ports, addresses and times differ between attempts)."""
    return bool(a) and _DIGITS.sub("#", a) == _DIGITS.sub("#", b)


def repeated(error: str, before: Iterable[str], attempts: int) -> bool:
    """Whether ``error`` (this attempt's, "" if none counts) makes ``attempts`` in a row with
    ``before``: the errors of the attempts just before it, newest first ("" where an attempt's
    failure did not count)."""
    if attempts <= 0 or not error:
        return False
    streak = 1
    for earlier in before:
        if streak >= attempts or not same(earlier, error):
            break
        streak += 1
    return streak >= attempts


def words(error: str, attempts: int, first_attempt: int) -> str:
    """The job's last words: "the same error on attempts 0 and 1, each before it trained:
    ZeroDivisionError: division by zero"."""
    last = first_attempt + attempts - 1
    if attempts == 1:
        return f"attempt {first_attempt} failed before it trained: {error}"
    which = f"attempts {first_attempt} and {last}" if attempts == 2 else f"attempts {first_attempt} to {last}"
    return f"the same error on {which}, each before it trained: {error}"
