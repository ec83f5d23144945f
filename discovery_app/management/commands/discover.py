import json as jsonlib

from django.core.management.base import CommandError

from shoal_common.cli import ShoalCommand

from discovery_app.conf import setting
from discovery_app.connection import TRANSIENT_ERRORS
from discovery_app.exceptions import InvalidRegistration
from discovery_app.registry import ServiceRegistry


def describe(instance, server_now, factor):
    age = instance.heartbeat_age(server_now)
    return {
        "instance_id": instance.instance_id,
        "url": instance.url,
        "address": instance.address,
        "port": instance.port,
        "version": instance.version,
        "zone": instance.zone,
        "weight": instance.weight,
        "tags": list(instance.tags),
        "registered_at": instance.registered_at,
        "last_heartbeat": instance.last_heartbeat,
        "heartbeat_age": round(age, 3),
        "ttl": instance.ttl,
        # Healthy for clients: a recent heartbeat and not failing its registrar's health check.
        "healthy": instance.is_healthy(factor, server_now) and not instance.failing,
        "failing": instance.failing,
        "draining": instance.draining,
    }


class Command(ShoalCommand):
    help = ("List the registered services, or the instances of one with their health and heartbeat age; "
            "take an instance out of rotation (--drain) or put it back (--undrain).")

    def add_arguments(self, parser):
        parser.add_argument("service", nargs="?", help="A service name; without it, list every service.")
        parser.add_argument("--json", action="store_true", help="Print JSON instead of a table.")
        rotation = parser.add_mutually_exclusive_group()
        rotation.add_argument("--drain", metavar="INSTANCE_ID",
                            help="Mark this instance of SERVICE draining: clients stop picking it; it stays registered.")
        rotation.add_argument("--undrain", metavar="INSTANCE_ID", help="Put a draining instance of SERVICE back in rotation.")

    def handle(self, *args, service, json: bool, drain=None, undrain=None, **options):
        as_json = json
        registry = ServiceRegistry()
        if drain == "" or undrain == "":
            raise CommandError("--drain/--undrain need an instance id; `discover SERVICE` lists them.")
        if drain or undrain:
            return self.set_draining(registry, service, drain or undrain, draining=bool(drain))
        try:
            if service is None:
                rows = {name: len(found) for name, found in registry.all_instances().items()}
            else:
                server_now, found = registry.fetch(service)
                rows = [describe(i, server_now, setting("HEALTHY_FACTOR")) for i in found]
        except InvalidRegistration as exc:
            raise CommandError(str(exc)) from None
        except TRANSIENT_ERRORS as exc:
            raise CommandError(f"cannot reach Redis ({exc}). Check REDIS_URL and that redis-server is running.") from None
        if as_json:
            self.stdout.write(_dumps(rows if service is None else {"service": service, "instances": rows}))
        elif service is None:
            if not rows:
                self.stdout.write("No service has a live instance.")
            for name, count in rows.items():
                self.stdout.write(f"{name}\t{count} instance{'s' if count != 1 else ''}")
        elif not rows:
            self.stdout.write(f"No live instance of {service}.")
        else:
            for row in rows:
                if row["failing"]:
                    health = self.style.WARNING("failing its health check")
                else:
                    health = self.style.SUCCESS("healthy") if row["healthy"] else self.style.WARNING("stale")
                if row["draining"]:
                    health += " " + self.style.WARNING("draining")
                self.stdout.write(
                    f"{row['instance_id']}\t{row['url']}\t{health}\theartbeat {row['heartbeat_age']:.1f} s ago\t"
                    f"zone={row['zone'] or '-'} version={row['version'] or '-'} weight={row['weight']:g}"
                    + (f" tags={','.join(row['tags'])}" if row["tags"] else "")
                )


    def set_draining(self, registry, service, instance_id, draining):
        if service is None:
            raise CommandError("name the service: discover SERVICE --drain INSTANCE_ID")
        try:
            done = registry.set_draining(service, instance_id, draining)
        except InvalidRegistration as exc:
            raise CommandError(str(exc)) from None
        except TRANSIENT_ERRORS as exc:
            raise CommandError(f"cannot reach Redis ({exc}). Check REDIS_URL and that redis-server is running.") from None
        if not done:
            raise CommandError(f"{instance_id} is not registered in {service}; `discover {service}` lists its instances.")
        state = "draining: clients stop picking it" if draining else "back in rotation"
        self.stdout.write(self.style.SUCCESS(f"{instance_id} of {service} is {state}."))


def _dumps(value):
    return jsonlib.dumps(value, indent=2, sort_keys=True)


