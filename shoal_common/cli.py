"""Pieces shared by the management commands: argparse types that explain themselves, verbosity to log level."""
import logging

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
    if not value > 0:  # also refuses nan
        raise ValueError(text)
    return value
