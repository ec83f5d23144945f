#!/usr/bin/env python
"""Django's command-line utility for administrative tasks, as a host project of Shoal writes it
(streams_app.commandline: exit 3 on configuration errors, early TERM for runconsumer)."""
import os
import sys


def main():
    # What `make run` chose (var/env: REDIS_URL, DEBUG, SHOAL_DEMO), so that the README's commands
    # work in any shell of this checkout; the environment's own values win.
    from project.devenv import load_dev_env

    load_dev_env()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    from streams_app.commandline import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
