"""Pieces shared by the management commands: argparse types that explain themselves, verbosity to log level."""
import logging
import math

from django.core.management.base import BaseCommand, SystemCheckError

from shoal_common.exitcodes import EXIT_CONFIG

VERBOSITY_LEVELS = {0: logging.WARNING, 1: logging.INFO, 2: logging.DEBUG, 3: logging.DEBUG}


def log_level(verbosity):
    """Django's -v 0..3 as a logging level (-v 1, the default, is INFO)."""
    return VERBOSITY_LEVELS.get(verbosity, logging.INFO)


def _named(name):
    # argparse words its error after the type's __name__: "invalid positive integer value: '0'".
    def decorate(function):
        function.__name__ = name
        return function

    return decorate


@_named("positive integer")
def positive_int(text):
    value = int(text)
    if value <= 0:
        raise ValueError(text)
    return value


@_named("port number (1-65535)")
def port(text):
    value = int(text)
    if not 0 < value < 65536:
        raise ValueError(text)
    return value


@_named("positive number")
def positive_float(text):
    value = float(text)
    if not (value > 0 and math.isfinite(value)):  # also refuses nan and inf
        raise ValueError(text)
    return value


@_named("number of seconds (0 or more)")
def non_negative_seconds(text):
    value = float(text)
    if not (value >= 0 and math.isfinite(value)):  # nan would cancel at once, inf wait forever
        raise ValueError(text)
    return value


def usage_errors_exit(parser, code):
    """Make a usage error (an unknown flag, a malformed or missing argument) one line and exit ``code``.

    argparse exits 2, which for Shoal means EXIT_FORCED (a second TERM: docs/operations.md); a
    service manager must not take a command whose flags can never work for one that was stopped.
    """
    from django.core.management.base import CommandError

    def error(message):
        if getattr(parser, "called_from_command_line", False):
            parser.exit(code, f"{parser.prog}: error: {message} (--help lists the options)\n")
        raise CommandError(f"Error: {message}", returncode=code)

    parser.error = error
    return parser


class ShoalCommand(BaseCommand):
    """A Shoal command: a usage error is one line and exit 1 (the one-shot commands: publish, replay,
    broadcast, discover), and its system checks leave the databases alone, on every supported Django.

    Django 6.1 hands the model checks every database unless told otherwise, and a JSONField's check
    then connects (5.2 did not). Shoal's commands need no database to start (a consumer whose handlers
    write nothing, publish, replay, discovery), and its daemons ride out a database outage; a check
    that connects would turn a database that is down, or not there at all, into a traceback at start.
    ``manage.py check --database default`` still runs the database checks.
    """

    usage_exit_code = 1

    def create_parser(self, prog_name, subcommand, **kwargs):
        return usage_errors_exit(super().create_parser(prog_name, subcommand, **kwargs), self.usage_exit_code)

    def check(self, *args, databases=None, **kwargs):
        return super().check(*args, databases=[] if databases is None else databases, **kwargs)


class DaemonCommand(ShoalCommand):
    """A long-running command (runconsumer, runreclaimer, runrelay, register): usage errors and failing
    system checks are configuration errors, exit 3, so a service manager does not restart it in a loop."""

    usage_exit_code = EXIT_CONFIG

    def check(self, *args, **kwargs):
        try:
            super().check(*args, **kwargs)
        except SystemCheckError as exc:
            exc.returncode = EXIT_CONFIG
            raise
