"""Errors that end a process, each with the exit status systemd and scripts can tell apart."""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    """Named exit statuses (sysexits-style), used by `RestartPreventExitStatus=`."""

    OK = 0
    FAILURE = 1          # a check found a problem (audit discrepancy, health down)
    USAGE = 2            # bad command line (argparse's own code)
    UNAVAILABLE = 69     # EX_UNAVAILABLE: cannot reach RabbitMQ or Redis
    SOFTWARE = 70        # EX_SOFTWARE: a bug; the traceback is in the log
    CONFIG = 78          # EX_CONFIG: bad settings; restarting will not help
    KILLED = 137         # second SIGTERM / forced stop (128 + SIGKILL)


class AldebaranError(Exception):
    """Base of the errors that carry their own exit status and a one-line reason."""

    exit_code: ExitCode = ExitCode.FAILURE


class ConfigError(AldebaranError):
    """A setting is unknown or has a bad value."""

    exit_code = ExitCode.CONFIG


class UnavailableError(AldebaranError):
    """A dependency (broker, Redis) cannot be reached."""

    exit_code = ExitCode.UNAVAILABLE


class TopologyConflict(AldebaranError):
    """The broker holds a queue or exchange declared with other arguments."""

    exit_code = ExitCode.CONFIG


class PublishRefused(AldebaranError):
    """The broker kept refusing a message (a full ingress with `overflow = reject-publish`)."""

    exit_code = ExitCode.UNAVAILABLE


class PublishUnconfirmed(AldebaranError):
    """A publish ended without the broker's confirm, neither refused nor lost with its connection."""

    exit_code = ExitCode.UNAVAILABLE
