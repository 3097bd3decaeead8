"""``manage.py channels create N | retire ADDRESS... | list`` (anchor/channels.py)."""

import os

from django.core.management import BaseCommand, CommandError

from anchor import channels, stellar


class Command(BaseCommand):
    help = ("Channel accounts: create and fund N from the distribution account and print "
            "the env lines to set (seeds never go to the database), retire some, or list "
            "them with their state, XLM for fees and the refusals counted.")

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        create = sub.add_parser("create")
        create.add_argument("count", type=int)
        create.add_argument("--env-file", default="",
                            help="also write the env lines to this file (mode 0600)")
        retire = sub.add_parser("retire")
        retire.add_argument("addresses", nargs="+")
        sub.add_parser("list")

    def handle(self, *args, action, **options):
        try:
            if action == "create":
                self._create(options["count"], options["env_file"])
            elif action == "retire":
                for address, outcome in channels.channels_retire(
                        addresses=options["addresses"]).items():
                    self.stdout.write(f"{address} {outcome}")
            else:
                self._list()
        except (channels.ChannelError, stellar.HorizonUnavailable) as exc:
            raise CommandError(str(exc)) from exc

    def _create(self, count: int, env_file: str) -> None:
        lines = channels.channels_create(count=count)
        self.stdout.write(f"# {count} channel accounts exist and are recorded; set:")
        for line in lines:
            self.stdout.write(line)
        if env_file:
            fd = os.open(env_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as handle:
                handle.write("\n".join(lines) + "\n")

    def _list(self) -> None:
        for row in channels.channels_status():
            self.stdout.write(f"{row.address} {row.state:9} xlm={row.xlm} "
                              f"holder={row.leased_by or '-'} until={row.leased_until or '-'}")
        self.stdout.write(f"refusals={stellar.channel_refusals()}")
