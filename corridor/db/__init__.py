"""Corridor's PostgreSQL backend (:mod:`corridor.db.base`: Django's, with a health check
that costs no round trip) and :func:`insert_unless_conflict`."""

from __future__ import annotations

from django.db import connections
from django.db.models import AutoField, BigAutoField, SmallAutoField

_AUTO = (AutoField, BigAutoField, SmallAutoField)


def insert_unless_conflict(instance, *, using: str = "default") -> bool:
    """Insert ``instance``'s row in ONE statement, ``INSERT ... ON CONFLICT DO NOTHING
    RETURNING`` its primary key: True (and ``instance.pk`` set) when inserted, False
    when a row already conflicts with it on any unique constraint or unique index,
    partial ones included (PostgreSQL docs, INSERT "ON CONFLICT Clause": with ``DO
    NOTHING`` and no conflict target, every unique index is an arbiter). A conflicting
    row still in flight is waited for, as a plain INSERT would.

    What it replaces: ``with transaction.atomic(): Model.objects.create(...)`` inside a
    caller's transaction, catching IntegrityError, which costs a SAVEPOINT and a
    RELEASE round trip besides the INSERT. Field values go through each field's own
    ``pre_save`` and ``get_db_prep_save`` (defaults, ``auto_now_add``, Decimal and JSON
    adaptation), as ``save()`` does; model signals and ``save()`` overrides do not run.
    Other errors (a CHECK constraint, a value too long) raise as they would."""
    connection = connections[using]
    meta = instance._meta
    quote = connection.ops.quote_name
    fields = [f for f in meta.concrete_fields
              if not (f.primary_key and isinstance(f, _AUTO) and instance.pk is None)
              and not getattr(f, "generated", False)]
    values = [f.get_db_prep_save(f.pre_save(instance, add=True), connection) for f in fields]
    sql = (f"INSERT INTO {quote(meta.db_table)} ({', '.join(quote(f.column) for f in fields)}) "
           f"VALUES ({', '.join(['%s'] * len(fields))}) ON CONFLICT DO NOTHING "
           f"RETURNING {quote(meta.pk.column)}")
    with connection.cursor() as cursor:
        cursor.execute(sql, values)
        found = cursor.fetchone()
    if found is None:
        return False
    instance.pk = found[0]
    instance._state.adding = False
    instance._state.db = using
    return True
