"""What every bench part needs: its own databases on the bench's server, and figures
printed as ``median [min-max]`` over the interleaved rounds."""

from __future__ import annotations

import statistics


def with_name(url: str, name: str) -> str:
    """``url`` (a PostgreSQL URL) naming database ``name`` instead."""
    return url.rsplit("/", 1)[0] + "/" + name


def admin_connection(url: str):
    """An autocommit connection to the ``postgres`` database of ``url``'s server."""
    import psycopg

    info = psycopg.conninfo.conninfo_to_dict(url)
    info["dbname"] = "postgres"
    return psycopg.connect(**info, autocommit=True)


def recreate(url: str, *, drop_only: bool = False) -> None:
    """Drop ``url``'s database (its sessions with it) and, unless ``drop_only``, create
    it empty."""
    import psycopg

    name = psycopg.conninfo.conninfo_to_dict(url)["dbname"]
    with admin_connection(url) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        if not drop_only:
            conn.execute(f'CREATE DATABASE "{name}"')


def spread(values: list[float], fmt: str = ".2f", *, sep: str = " ") -> str:
    """``median<sep>[min-max]`` of ``values``, each formatted with ``fmt``."""
    return (f"{statistics.median(values):{fmt}}{sep}"
            f"[{min(values):{fmt}}-{max(values):{fmt}}]")
