"""Assembling a supervisor from settings and runconsumer's options (the command stays an adapter)."""
import atexit
import shutil

from streams_app.metrics import multiprocess
from streams_app.supervisor.autoscale import Autoscaler
from streams_app.conf import get_settings
from streams_app.redis.connection import get_connection
from streams_app.consuming.follow import respecify
from streams_app.redis.lag import read_lags
from streams_app.metrics.supervisor import PoolMetrics
from streams_app.supervisor.spawn import ExecSpawner
from streams_app.supervisor.master import Supervisor
from streams_app.tasks.periodic.scheduler import for_specs


def _pick(options, name, config, key):
    value = options.get(name)
    return config[key] if value is None else value


def build_supervisor(selectors, specs, options, *, log_level=None):
    config = get_settings()
    interval = _pick(options, "scale_interval", config, "SCALE_INTERVAL")
    shutdown_timeout = _pick(options, "shutdown_timeout", config, "SHUTDOWN_TIMEOUT")
    heartbeat_interval = _pick(options, "heartbeat_interval", config, "HEARTBEAT_INTERVAL")
    autoscaler = None
    if options.get("max_workers") is not None:
        autoscaler = Autoscaler(minimum=options.get("min_workers") or 1, maximum=options["max_workers"],
                                target=_pick(options, "target_lag", config, "TARGET_LAG"), interval=interval)
    metrics = None
    spawner_env = {}
    if options.get("metrics_port"):
        metrics = PoolMetrics()
        # Workers read PROMETHEUS_MULTIPROC_DIR when they import prometheus_client: a directory of
        # this master's own, whatever the environment says (it may be the web tier's).
        path = multiprocess.supervisor_directory()
        atexit.register(shutil.rmtree, path, True)
        metrics.collect_workers(path)
        spawner_env[multiprocess.ENV] = path
        metrics.serve(options["metrics_port"], options.get("metrics_addr") or "127.0.0.1")
    reads_lag = autoscaler is not None or metrics is not None
    heartbeat_timeout = _pick(options, "heartbeat_timeout", config, "HEARTBEAT_TIMEOUT")
    worker_options = dict(
        heartbeat_interval=heartbeat_interval, threads=options.get("threads"), concurrency=options.get("concurrency"),
        batch=options.get("batch"), block_ms=options.get("block_ms"), shutdown_timeout=shutdown_timeout, log_level=log_level,
    )
    if options.get("preload"):
        from streams_app.supervisor.preload import ZygoteSpawner

        # The zygote boots as a worker would: as long as a worker may take to boot.
        spawner = ZygoteSpawner(selectors, boot_timeout=heartbeat_timeout, **worker_options)
    else:
        spawner = ExecSpawner(selectors, **worker_options)
    spawner.env.update(spawner_env)
    return Supervisor(
        spawner,
        workers=options.get("workers") or 1,
        autoscaler=autoscaler,
        lag_reader=(lambda: read_lags(get_connection(), respecify(specs))) if reads_lag else None,  # the live layout
        lag_interval=interval,
        shutdown_timeout=shutdown_timeout,
        heartbeat_timeout=heartbeat_timeout,
        restart_delay=config["RESTART_DELAY"],
        crash_limit=config["CRASH_LIMIT"],
        crash_window=config["CRASH_WINDOW"],
        metrics=metrics,
        label=" ".join(selectors) or "all consumers",
        scheduler=for_specs(specs),
    )
