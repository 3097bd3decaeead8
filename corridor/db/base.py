"""Django's PostgreSQL backend (psycopg 3) with a health check that sends nothing.

Django's ``CONN_HEALTH_CHECKS`` pings a reused connection with ``SELECT 1`` before a
request's first query (Django docs, "Databases: Persistent connections"): one more
round trip on every request, a fifth of a Razorpay webhook's time under load
(issue 11 §3). What the ping is there to catch is a connection the server has
closed: a restart, ``pg_terminate_backend``, an idle timeout. PostgreSQL tells the
client when it does so (an ``ErrorResponse`` "terminating connection ...", then EOF;
PostgreSQL docs, "Protocol Flow: Termination"), so an idle connection with bytes to
read, or one libpq already knows is bad, is closed and reopened instead; an idle one
with nothing to read is used as it is. Select ``ENGINE = "corridor.db"``
(corridor/settings/base.py does for every PostgreSQL alias).

What it does not catch, unlike the ping: a peer that vanished without a word (a
network path cut with no FIN or RST). That query then fails, Django closes the
connection at the end of the request (``close_if_unusable_or_obsolete``), and the
sender's retry gets a fresh one: webhooks and AP callbacks are redelivered, pages
are reloaded. Everything else (errors inside a request, ``CONN_MAX_AGE``) is
Django's own behaviour.
"""

from __future__ import annotations

import select

from django.db.backends.postgresql import base
from psycopg import pq


class DatabaseWrapper(base.DatabaseWrapper):
    def close_if_health_check_failed(self) -> None:
        """Before a request's first query on a reused connection (when
        ``CONN_HEALTH_CHECKS`` is on): close it if the server has ended it."""
        if self.connection is None or not self.health_check_enabled or self.health_check_done:
            return
        if not self.connection_alive():
            self.close()
        self.health_check_done = True

    def connection_alive(self) -> bool:
        """True when the open connection is idle, libpq holds it good, and the server
        has sent nothing since the last answer (no round trip; see the module
        docstring)."""
        pgconn = self.connection.pgconn
        if pgconn.status != pq.ConnStatus.OK:
            return False
        if pgconn.transaction_status != pq.TransactionStatus.IDLE:
            return False
        # poll(), not select(): select() refuses descriptors past FD_SETSIZE (1024).
        poller = select.poll()
        try:
            poller.register(pgconn.socket, select.POLLIN)
            return not poller.poll(0)
        except (OSError, ValueError):
            return False
