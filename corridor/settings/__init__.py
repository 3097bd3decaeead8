"""Settings entry point (``DJANGO_SETTINGS_MODULE=corridor.settings``).

``CORRIDOR_ENV`` picks the module, in the cookiecutter-django manner:
``production`` -> ``corridor.settings.production`` (no sandbox, deploy checks enforced);
anything else (default ``development``) -> ``corridor.settings.development`` (the base
settings plus the sandbox apps and database), which ``make run`` and ``make test`` use.
"""

import os

if os.environ.get("CORRIDOR_ENV", "development").strip().lower() == "production":
    from .production import *  # noqa: F403
else:
    from .development import *  # noqa: F403
