#!/usr/bin/env python
import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "corridor.settings")
    if sys.argv[1:2] in (["check"], ["collectstatic"]):
        # `check` reports an unsafe production configuration as system-check errors
        # (one per problem) instead of refusing at startup (corridor/checks.py);
        # `collectstatic` runs at build time, before the secrets exist, and moves no
        # money and calls nothing.
        import corridor.checks

        corridor.checks.REFUSE_AT_STARTUP = False
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
