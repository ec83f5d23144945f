"""Exit codes of Shoal's long-running commands (runconsumer, its master and workers, runreclaimer, register).

docs/operations.md has the table. Importable before Django is set up (a worker's entry point needs
EXIT_CONFIG to report a boot failure).
"""
EXIT_OK = 0  # stopped cleanly (TERM/INT)
EXIT_CRASH = 1  # a read loop died, or a master's workers kept crashing: let the supervisor restart it
EXIT_FORCED = 2  # a second TERM/INT: stopped without waiting for handlers; unacked entries stay pending
EXIT_CONFIG = 3  # cannot start as configured (bad settings, ImportError, unknown selector): restarting will not help
EXIT_BURST_UNFINISHED = 4  # runconsumer --burst gave up with work left (--burst-timeout, or Redis unreachable)
EXIT_REPLACED = 5  # a runconsumer worker asks its supervisor for a fresh process (a task ran past its timeout)
