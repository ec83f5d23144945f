import logging
import os
import sys

from django.core.management.base import CommandError

from shoal_common.cli import DaemonCommand, log_level, non_negative_seconds, port, positive_int, positive_float

from streams_app.conf import get_settings
from streams_app.exceptions import ConsumerConfigError, StreamsError
from streams_app.checks import settings_errors
from streams_app.registry import select
from streams_app.consuming.burst import BurstGaveUp
from streams_app.consuming.worker import EXIT_BURST_UNFINISHED, EXIT_CONFIG, EXIT_OK, Worker
from streams_app.tasks.periodic.scheduler import for_specs


_POOL_ONLY = ("heartbeat_interval", "heartbeat_timeout")
# More workers than this in one supervisor is a typo, not a plan: 100,000 forks took a host down.
# Past it, run more supervisors (hosts, pods).
MAX_POOL_SIZE = 256
# --burst gives up after this long by default: a test's burst takes seconds; a handler feeding its own
# stream, or a Redis that never answers, would otherwise hang the test run.
BURST_TIMEOUT = 300.0


def config_error(message):
    """Options that contradict each other or the settings: exit 3 (docs/operations.md, exit codes)."""
    return CommandError(message, returncode=EXIT_CONFIG)


class Command(DaemonCommand):
    help = (
        "Run the registered stream consumers (all, or the STREAM:GROUP pairs named). Without --workers or "
        "--min/--max-workers, one consumer runs in this process; with them, this process is a supervisor "
        "that forks worker processes, restarts crashed ones, follows the backlog and reloads on SIGHUP."
    )

    def add_arguments(self, parser):
        parser.add_argument("selectors", nargs="*", metavar="STREAM:GROUP",
                            help="Consumers to run, e.g. orders:email. Splits at the last ':'. Default: all registered.")
        parser.add_argument("--threads", type=positive_int, help="Handler threads per process (default STREAMS['THREADS']).")
        parser.add_argument("--concurrency", type=positive_int,
                            help="The most async def handlers awaited at once per process, on its event loop "
                                 "(default STREAMS['ASYNC_CONCURRENCY']).")
        parser.add_argument("--batch", type=positive_int, help="Entries per read (default STREAMS['BATCH_SIZE']).")
        parser.add_argument("--block-ms", type=positive_int, help="How long an idle read blocks, in ms (default STREAMS['BLOCK_MS']).")
        parser.add_argument("--shutdown-timeout", type=non_negative_seconds,
                            help="Seconds in-flight handlers get after SIGTERM (default STREAMS['SHUTDOWN_TIMEOUT']).")
        parser.add_argument("--burst", action="store_true",
                            help="Handle what the streams hold now (new entries, and pending ones due for takeover), "
                                 "and what those handlers publish to the selected streams, wait for the handlers, "
                                 "then exit 0 instead of waiting for more. For tests and batch jobs; entries that "
                                 "failed and wait for a retry stay pending. Exits 4 with work left after "
                                 "--burst-timeout, or when Redis is unreachable for 10 s. One process "
                                 "only (not with --workers), and not for ordered=True consumers.")
        parser.add_argument("--burst-timeout", type=positive_float, default=None,
                            help=f"With --burst: give up after this many seconds, exit 4 (default {BURST_TIMEOUT:g}).")
        pool = parser.add_argument_group("supervisor (worker pool)")
        pool.add_argument("--workers", type=positive_int,
                          help="Run a supervisor with this many worker processes (fixed; SIGTTIN/SIGTTOU add or remove one).")
        pool.add_argument("--min-workers", type=positive_int,
                          help="Autoscale: the fewest worker processes (default 1; needs --max-workers).")
        pool.add_argument("--max-workers", type=positive_int, help="Autoscale: the most worker processes.")
        pool.add_argument("--target-lag", type=positive_int,
                          help="Autoscale: backlog to aim for; above 2x add up to 2 workers, below half remove 1 "
                               "(default STREAMS['TARGET_LAG']).")
        pool.add_argument("--scale-interval", type=positive_float,
                          help="Seconds between backlog readings and scaling decisions (default STREAMS['SCALE_INTERVAL']).")
        pool.add_argument("--preload", action="store_true",
                          help="Fork workers from a zygote process that has imported Django and the consumers "
                               "once (copy-on-write: less memory per worker, faster starts) instead of starting "
                               "each as a new interpreter. SIGHUP still loads new code: a new zygote imports it. "
                               "Linux only.")
        pool.add_argument("--heartbeat-interval", type=positive_float,
                          help="Seconds between worker heartbeats (default STREAMS['HEARTBEAT_INTERVAL']).")
        pool.add_argument("--heartbeat-timeout", type=positive_float,
                          help="Kill and replace a worker without heartbeat (or handler progress) for this long "
                               "(default STREAMS['HEARTBEAT_TIMEOUT']).")
        parser.add_argument("--metrics-port", type=port,
                            help="Serve Prometheus metrics on this port: handled/failed/dead-lettered counters, handler "
                                 "durations, in-flight, backlog; with a supervisor, summed over its workers, plus "
                                 "desired and current workers.")
        parser.add_argument("--metrics-addr", default="127.0.0.1",
                          help="Address for --metrics-port (default 127.0.0.1; 0.0.0.0 to let Prometheus scrape it).")

    def handle(self, *args, selectors, verbosity, **options):
        problems = settings_errors()  # also when called without system checks (call_command)
        if problems:
            raise CommandError("STREAMS settings are invalid (python manage.py check lists them): " + "; ".join(problems),
                               returncode=EXIT_CONFIG)
        level = log_level(verbosity)
        logging.getLogger("streams_app").setLevel(level)
        if options["shutdown_timeout"] is not None and options["shutdown_timeout"] < 0:
            raise config_error("--shutdown-timeout must be 0 or more seconds.")
        pooled = self.validate_pool_options(options)
        try:
            specs = select(selectors)
        except ConsumerConfigError as exc:
            raise config_error(str(exc)) from None
        if options["burst_timeout"] is not None and not options["burst"]:
            raise config_error("--burst-timeout needs --burst.")
        if options["burst"]:
            if pooled:
                raise config_error("--burst runs one process: leave out --workers/--min-workers/--max-workers.")
            ordered = [spec.name for spec in specs if spec.ordered]
            if ordered:
                raise config_error(f"--burst does not run ordered=True consumers ({', '.join(sorted(set(ordered)))}); "
                                   "select the others with STREAM:GROUP.")
        if pooled:
            return self.run_supervisor(selectors, specs, level, options)
        return self.run_in_process(specs, options)

    def validate_pool_options(self, options):
        workers, low, high = options["workers"], options["min_workers"], options["max_workers"]
        for flag, value in (("--workers", workers), ("--min-workers", low), ("--max-workers", high)):
            if value is not None and value > MAX_POOL_SIZE:
                raise config_error(f"{flag} {value} is more than one supervisor runs ({MAX_POOL_SIZE}); run several "
                                   f"supervisors (on more hosts or pods) for more workers.")
        if options["metrics_addr"] != "127.0.0.1" and options["metrics_port"] is None:
            raise config_error("--metrics-addr needs --metrics-port: metrics are served only on the port given.")
        if workers is not None and (low is not None or high is not None):
            raise config_error("Give either --workers N (a fixed pool) or --min-workers/--max-workers (autoscaling), not both.")
        if low is not None and high is None:
            raise config_error("--min-workers needs --max-workers: autoscaling keeps the count between the two.")
        if low is not None and low > high:
            raise config_error(f"--min-workers ({low}) is above --max-workers ({high}).")
        autoscaling = high is not None
        if options["target_lag"] is not None and not autoscaling:
            raise config_error("--target-lag only applies with --min-workers/--max-workers (autoscaling).")
        pooled = autoscaling or workers is not None
        if not pooled:
            given = [name for name in (*_POOL_ONLY, "scale_interval") if options[name] is not None]
            given += ["preload"] if options.get("preload") else []
            if given:
                flags = ", ".join("--" + name.replace("_", "-") for name in given)
                raise config_error(f"{flags} {'need' if len(given) > 1 else 'needs'} a supervisor: add --workers N or "
                                   "--min-workers/--max-workers.")
        elif options["scale_interval"] is not None and not autoscaling and options["metrics_port"] is None:
            raise config_error("--scale-interval applies to autoscaling or --metrics-port (lag readings).")
        if options.get("preload") and not sys.platform.startswith("linux"):
            raise config_error("--preload needs Linux (its workers are re-parented to the master with PR_SET_CHILD_SUBREAPER).")
        config = get_settings()
        interval = options["heartbeat_interval"] or config["HEARTBEAT_INTERVAL"]
        timeout = options["heartbeat_timeout"] or config["HEARTBEAT_TIMEOUT"]
        if pooled and timeout <= interval:
            raise config_error(f"--heartbeat-timeout ({timeout}s) must be above --heartbeat-interval ({interval}s).")
        return pooled

    def run_in_process(self, specs, options):
        if options["metrics_port"]:
            from streams_app.metrics.consumer import start_metrics_server

            try:
                start_metrics_server(options["metrics_port"], options["metrics_addr"])
            except OSError as exc:
                raise CommandError(f"cannot serve metrics on port {options['metrics_port']}: {exc}") from None
        scheduler = None if options["burst"] else for_specs(specs)  # one, kept across a repartition's restarts
        while True:
            worker = Worker(specs, threads=options["threads"], batch=options["batch"], block_ms=options["block_ms"],
                            shutdown_timeout=options["shutdown_timeout"], concurrency=options["concurrency"],
                            burst=options["burst"], burst_timeout=options["burst_timeout"] or BURST_TIMEOUT,
                            scheduler=scheduler)
            if sys.argv[1:2] == ["runconsumer"]:  # this process is the command's own, not a call_command in a test
                worker.replace = _exec_again
            try:
                code = worker.run()
            except BurstGaveUp as exc:
                raise CommandError(str(exc), returncode=EXIT_BURST_UNFINISHED) from None
            except StreamsError as exc:
                raise CommandError(str(exc), returncode=EXIT_CONFIG) from None
            # Stopped to follow a repartition (consuming/follow.py): a new worker reads the new layout.
            if code != EXIT_OK or worker.stuck or worker.follower.changed is None:
                break
        if worker.stuck:
            # Handler threads that ignored the shutdown timeout would keep the interpreter alive.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        if code == EXIT_BURST_UNFINISHED:
            raise CommandError(worker.burst_left, returncode=code)
        if code:
            raise CommandError(f"consumer {worker.name} stopped after an error (exit {code}); see the log above.", returncode=code)

    def run_supervisor(self, selectors, specs, level, options):
        from streams_app.supervisor.factory import build_supervisor

        try:
            supervisor = build_supervisor(selectors, specs, options, log_level=level)
        except ConsumerConfigError as exc:
            raise config_error(str(exc)) from None
        except OSError as exc:
            raise CommandError(f"cannot serve metrics on port {options['metrics_port']}: {exc}") from None
        code = supervisor.run()
        if code:
            raise CommandError(f"the supervisor stopped with exit {code}; see the log above.", returncode=code)


def _exec_again():
    """A task ran past its timeout (streams_app/tasks/timelimits.py): this process is replaced by the same
    command started afresh, in place (the same pid for systemd or a container runtime)."""
    os.execv(sys.executable, sys.orig_argv)
