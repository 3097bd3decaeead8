"""What each stand-in contributes to the sandbox process: URL prefixes, background
loops (ledger close, event delivery, webhook delivery) and a reset hook.

Each stand-in package (``sandbox.horizon``, ``sandbox.ap``, ``sandbox.razorpay``) may
define in its ``service.py``:

- ``def background(stop: threading.Event) -> None`` run in a daemon thread until ``stop``;
- ``def reset() -> None`` to empty its tables and recreate its fixed world.
"""

from __future__ import annotations

import importlib
import logging
import threading

log = logging.getLogger(__name__)

STANDINS = ["sandbox.horizon", "sandbox.ap", "sandbox.razorpay", "sandbox.anchor31"]


def _service(package: str):
    try:
        return importlib.import_module(f"{package}.service")
    except ModuleNotFoundError as exc:
        if exc.name == f"{package}.service":
            return None
        raise


def reset_world() -> None:
    from sandbox.control import faults

    faults.clear_faults()
    for package in STANDINS:
        service = _service(package)
        if service is not None and hasattr(service, "reset"):
            service.reset()


def start_background(stop: threading.Event) -> list[threading.Thread]:
    threads = []
    for package in STANDINS:
        service = _service(package)
        if service is None or not hasattr(service, "background"):
            continue

        def loop(fn=service.background, name=package):
            try:
                fn(stop)
            except Exception:  # a crashed loop must be visible, not silent
                log.exception("sandbox background loop %s crashed", name)
                raise

        thread = threading.Thread(target=loop, name=f"{package}-bg", daemon=True)
        thread.start()
        threads.append(thread)
    return threads
