import logging
import math
import queue
import signal

from django.core.management.base import CommandError

from shoal_common.cli import DaemonCommand, log_level, positive_float
from shoal_common.exitcodes import EXIT_CONFIG

from discovery_app.exceptions import InvalidRegistration
from discovery_app.registrar import Registrar

def port_number(text):
    value = int(text)
    if not 0 < value < 65536:
        raise ValueError(text)
    return value


port_number.__name__ = "port (1-65535)"


def weight_number(text):
    value = float(text)
    if not math.isfinite(value) or value < 0:
        raise ValueError(text)
    return value


weight_number.__name__ = "weight (a finite number >= 0)"


class Command(DaemonCommand):
    help = ("Register an instance of SERVICE and heartbeat until SIGTERM/SIGINT, then deregister: "
            "a sidecar for processes that are not Python.")

    def create_parser(self, prog_name, subcommand, **kwargs):
        # The issue asks for --version V (the service's version); it replaces Django's --version.
        return super().create_parser(prog_name, subcommand, conflict_handler="resolve", **kwargs)

    def add_arguments(self, parser):
        parser.add_argument("service", help="The service name clients resolve, e.g. order-service.")
        parser.add_argument("--address", required=True, help="Host name or IP clients connect to.")
        parser.add_argument("--port", required=True, type=port_number, help="TCP port clients connect to.")
        parser.add_argument("--zone", help="Zone of the instance (clients prefer their own zone).")
        parser.add_argument("--weight", type=weight_number, default=1.0, help="Relative weight; every strategy honours it, 0 drains (default 1).")
        parser.add_argument("--version", dest="instance_version", default="", help="Version of the service.")
        parser.add_argument("--tag", action="append", default=[], dest="tags", help="A tag; repeat for more.")
        parser.add_argument("--scheme", choices=("http", "https"), default="http",
                            help="Whether clients call the instance over http or https (default http).")
        parser.add_argument("--instance-id", help="Instance id (default: SERVICE-HOST-PID-RANDOM).")
        parser.add_argument("--interval", type=positive_float, help="Seconds between heartbeats (default DISCOVERY['HEARTBEAT_INTERVAL']).")
        parser.add_argument("--ttl", type=positive_float, help="Seconds without a heartbeat before expiry (default DISCOVERY['TTL']).")

    def handle(self, *args, service, address, port, zone, weight, instance_version, tags, scheme, instance_id,
               interval, ttl, verbosity, **options):
        logging.getLogger("discovery_app").setLevel(log_level(verbosity))
        if any(value is not None and not (value > 0 and math.isfinite(value)) for value in (interval, ttl)):
            raise CommandError("--interval and --ttl must be positive numbers of seconds.", returncode=EXIT_CONFIG)
        metadata = {"zone": zone, "weight": weight, "version": instance_version, "tags": tags, "scheme": scheme}
        try:
            registrar = Registrar(service, address, port, metadata, interval=interval, instance_id=instance_id, ttl=ttl)
        except InvalidRegistration as exc:  # a bad --address, --instance-id...: restarting will not help
            raise CommandError(str(exc), returncode=EXIT_CONFIG) from None
        signals = queue.SimpleQueue()
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda signum, frame: signals.put(signum))
        registrar.start()
        if registrar.registered.is_set():
            self.stdout.write(self.style.SUCCESS(f"Registered {registrar.instance_id} of {service} at {registrar.instance.url}"))
        else:
            self.stdout.write(self.style.WARNING(f"Redis is unreachable; {registrar.instance_id} will register when it is back"))
        while True:
            try:
                signum = signals.get(timeout=1.0)
                break
            except queue.Empty:
                if registrar.deregistered_by_operator:
                    registrar.stop()
                    raise CommandError(f"{registrar.instance_id} was deregistered by an operator; stopping.", returncode=1) from None
        registrar.stop()
        self.stdout.write(f"Deregistered {registrar.instance_id} ({signal.Signals(signum).name})")
