"""The one TLS context of a process, shared by every outbound ``httpx`` client.

``httpx.Client()`` builds a new ``ssl.SSLContext`` and loads the CA bundle each time it
is constructed, even for a plain ``http://`` URL: about 25-40 ms of CPU on these
machines, paid per call because Corridor opens a client per call (each with its own
timeout, auth and base URL). An ``SSLContext`` is safe to share between threads and
clients (Python docs, ``ssl`` "SSL contexts"), so each process builds one, the way
httpx builds its default (``httpx.create_ssl_context``: ``SSL_CERT_FILE`` /
``SSL_CERT_DIR`` from the environment, else certifi's bundle), and every client gets
it as ``verify=tls_context()``. Certificate checks stay on.
"""

from __future__ import annotations

import functools
import ssl

import httpx


@functools.cache
def tls_context() -> ssl.SSLContext:
    """This process's TLS context (built on first use, then shared)."""
    return httpx.create_ssl_context()
