"""Body of ``make run``: runs inside ``corridor.devservices run`` (services up, URLs in
the environment). Prepares the database, then hands over to honcho (Procfile.dev).
honcho stops every process it started on Ctrl-C; devservices then stops PostgreSQL
and Redis."""

import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def main() -> int:
    os.chdir(ROOT)
    python = str(BIN / "python")
    subprocess.run([python, "manage.py", "migrate", "--noinput"], check=True)
    subprocess.run([python, "manage.py", "setup_periodic_tasks"], check=True)
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    # Ctrl-C reaches honcho too, which stops its processes; we just wait for it.
    signal.signal(signal.SIGINT, lambda *_: None)
    return subprocess.call([str(BIN / "honcho"), "start", "-f", "Procfile.dev"], env=env)


if __name__ == "__main__":
    sys.exit(main())
