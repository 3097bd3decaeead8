"""Groups of the operator console (DESIGN.md §1 "Operators"):

- ``operators``: every view permission of the console's apps, and the action
  permissions declared in ``Meta.permissions`` of the audit models
  (``anchor.ReleaseEvent``, ``anchor.ApTransactionEvent``, ``payouts.PayoutEvent``) and
  of the queue (``sagas.ReviewItem``);
- ``auditors``: the view permissions only.

Neither group gets add, change or delete on any model: every change goes through an
action, which goes through a service. A person also needs ``is_staff`` to open /admin/.
A later migration that adds models or actions calls ``sync_groups`` again (it is
idempotent: it sets each group's permissions to exactly these)."""

from django.db import migrations

APPS = ("anchor", "payouts", "sagas", "ledger", "django_celery_beat")
ACTIONS = {
    "anchor": ("redrive_release", "expire_ap_transaction"),
    "payouts": ("confirm_payout_paid", "mark_payout_failed", "new_payout_attempt",
                "accept_short_withdrawal", "refund_withdrawal"),
    "sagas": ("resume_saga", "retry_saga_step", "compensate_saga", "resolve_saga"),
}


def sync_groups(apps, schema_editor):
    from django.contrib.auth.management import create_permissions

    using = schema_editor.connection.alias
    # Permissions are normally created after the last migration (post_migrate); make
    # them now so the groups can hold them on a fresh database.
    for label in APPS:
        app_config = apps.get_app_config(label)
        kept = getattr(app_config, "models_module", None)  # unset on historical apps
        app_config.models_module = kept or True
        try:
            create_permissions(app_config, apps=apps, verbosity=0, using=using)
        finally:
            app_config.models_module = kept
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    view = list(Permission.objects.using(using).filter(
        content_type__app_label__in=APPS, codename__startswith="view_"))
    actions = []
    for label, codenames in ACTIONS.items():
        found = list(Permission.objects.using(using).filter(
            content_type__app_label=label, codename__in=codenames))
        missing = set(codenames) - {p.codename for p in found}
        if missing:
            raise RuntimeError(f"permissions missing for {label}: {sorted(missing)}")
        actions += found
    operators, _ = Group.objects.using(using).get_or_create(name="operators")
    auditors, _ = Group.objects.using(using).get_or_create(name="auditors")
    operators.permissions.set(view + actions)
    auditors.permissions.set(view)


def drop_groups(apps, schema_editor):
    Group = apps.get_model("auth", "Group")
    Group.objects.using(schema_editor.connection.alias).filter(
        name__in=["operators", "auditors"]).delete()


class Migration(migrations.Migration):

    dependencies = [
        ("sagas", "0003_operator_review_queue"),
        ("anchor", "0002_operator_events"),
        ("payouts", "0002_operator_events_refunds"),
        ("ledger", "0002_ledger_rules"),
        ("django_celery_beat", "0019_alter_periodictasks_options"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [migrations.RunPython(sync_groups, drop_groups)]
