"""``python manage.py sandbox [--addr 127.0.0.1:$SANDBOX_PORT] [--reset]``: serve the
stand-ins (``SANDBOX_PORT``: settings, default 8100).

Creates and migrates the sandbox database (``SANDBOX_DATABASE_URL``), starts the
background loops of each stand-in and serves ``sandbox.urls`` with a threaded WSGI
server (Horizon's synchronous submit holds a request open until a ledger closes)."""

import logging
import threading

import psycopg
from django.conf import settings
from django.core.management import BaseCommand, call_command
from django.core.servers.basehttp import ThreadedWSGIServer, WSGIRequestHandler
from django.core.wsgi import get_wsgi_application

from sandbox.registry import reset_world, start_background


def ensure_sandbox_database() -> None:
    db = settings.DATABASES["sandbox"]
    params = {
        "host": db.get("HOST") or "127.0.0.1",
        "port": db.get("PORT") or 5432,
        "user": db.get("USER") or "postgres",
        "password": db.get("PASSWORD") or None,
        "dbname": "postgres",
        "autocommit": True,
    }
    with psycopg.connect(**params) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [db["NAME"]])
        if not exists.fetchone():
            conn.execute(f'CREATE DATABASE "{db["NAME"]}"')


class QuietHandler(WSGIRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - signature of the base class
        if settings.DEBUG and getattr(settings, "SANDBOX_ACCESS_LOG", False):
            super().log_message(format, *args)


class Command(BaseCommand):
    help = "Serve the sandbox stand-ins (Horizon, Anchor Platform, Razorpay/RazorpayX)."

    def add_arguments(self, parser):
        parser.add_argument("--addr", default=f"127.0.0.1:{settings.SANDBOX_PORT}")
        parser.add_argument("--reset", action="store_true", help="start from an empty world")

    def handle(self, *args, addr, reset, **options):
        # Refusals are the sandbox's job; Django's warning per 4xx would drown the log.
        logging.getLogger("django.request").setLevel(logging.ERROR)
        ensure_sandbox_database()
        call_command("migrate", database="sandbox", verbosity=0)
        settings.ROOT_URLCONF = "sandbox.urls"
        # The AP observer polls Horizon several times a second: its reads at DEBUG.
        settings.REQUEST_LOG_DEBUG_GETS = ("/horizon/",)
        if reset:
            reset_world()
        stop = threading.Event()
        start_background(stop)
        host, port = addr.rsplit(":", 1)
        self.stdout.write(f"sandbox serving on http://{host}:{port}/", ending="\n")
        self.stdout.flush()
        httpd = ThreadedWSGIServer((host, int(port)), QuietHandler)
        httpd.set_app(get_wsgi_application())
        try:
            httpd.serve_forever(poll_interval=0.2)
        finally:
            stop.set()

