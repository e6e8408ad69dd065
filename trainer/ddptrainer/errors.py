"""The trainer's failures, each tied to one exit code of ``ddpjob.contract.ExitCode``.

Code raises one of these; only ``main`` turns them into an exit status, so the mapping from
cause to exit code lives in one place and the operator can trust it (retry or fail).
"""
from __future__ import annotations

import re

from ddpjob.contract import ExitCode


class TrainerError(Exception):
    """A failure whose cause is known; ``exit_code`` is what the process exits with."""

    exit_code: int = int(ExitCode.FAILURE)
    #: Short words for the termination message ("bad configuration", "data missing", ...).
    kind: str = "error"

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class ConfigError(TrainerError):
    """A bad flag or value, or a GPU asked for where none is. Permanent.

    The message starts with the flag it is about (``--lr: must be > 0``), so the one line
    ``ddptrain: error: <message>`` tells the user what to change.
    """

    exit_code = int(ExitCode.BAD_CONFIG)
    kind = "bad configuration"
    #: Every rank hits it alike (a flag, a value), so local rank 0's line is enough; False for
    #: one that only some ranks hit (a LOCAL_RANK without a GPU of its own), which each says.
    same_on_every_rank = True


class RankConfigError(ConfigError):
    """A bad configuration that only some ranks hit (a LOCAL_RANK with no GPU of its own):
    every rank that hits it says so, local rank 0 among them or not."""

    same_on_every_rank = False


class DataMissingError(TrainerError):
    """The data set is not where the configuration says (and may not be downloaded). Permanent."""

    exit_code = int(ExitCode.DATA_MISSING)
    kind = "data missing"


class RendezvousTimeoutError(TrainerError):
    """The process group could not be formed in time (master unreachable). Retryable."""

    exit_code = int(ExitCode.RENDEZVOUS_TIMEOUT)
    kind = "rendezvous timeout"


class PeerLostError(TrainerError):
    """A peer died or a collective timed out mid-training. Retryable from the checkpoint."""

    exit_code = int(ExitCode.PEER_LOST)
    kind = "peer lost"


class CheckpointError(TrainerError):
    """Writing or reading a checkpoint failed (an I/O error, a file one rank cannot read).
    Retryable."""

    exit_code = int(ExitCode.FAILURE)
    kind = "checkpoint error"


class DiskFullError(CheckpointError):
    """No space left on the checkpoint volume. Permanent: a restarted gang would write to the
    same full volume and fail at the same save, spending the restart budget for nothing."""

    exit_code = int(ExitCode.DISK_FULL)
    kind = "disk full"


class Preempted(TrainerError):
    """SIGTERM (or SIGINT) arrived; a checkpoint was saved. Exit code 128 + signal number."""

    kind = "preempted"

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.exit_code = 128 + signum


# What gloo, NCCL and the c10d store say when a peer disappears or a collective times out.
# gloo raises a plain RuntimeError ("Read error ...: Connection reset by peer"), so the type
# alone cannot tell a lost peer from a bug in the model; the text can.
_COLLECTIVE_FAILURE = re.compile(
    r"connection (reset|closed|refused)|broken pipe|timed out|timeout|gloo|nccl|"
    r"processgroup|c10d|socket|peer|watchdog",
    re.IGNORECASE,
)


def is_collective_failure(error: BaseException) -> bool:
    """Whether an exception raised while training means "the gang is broken", not "a bug".

    ``torch.distributed.DistError`` (and its DistBackendError/DistNetworkError/DistStoreError)
    always does; a RuntimeError does when its text is one of the transport's messages.
    """
    try:
        import torch.distributed as dist

        if isinstance(error, dist.DistError):
            return True
    except ImportError:  # pragma: no cover - torch is always there in the trainer
        pass
    return isinstance(error, RuntimeError) and bool(_COLLECTIVE_FAILURE.search(str(error)))
