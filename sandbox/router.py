SANDBOX_APPS = {"sandbox_control", "sandbox_horizon", "sandbox_ap", "sandbox_razorpay",
                "sandbox_anchor31"}


class SandboxRouter:
    """Sends the sandbox apps to the ``sandbox`` database and everything else away from it."""

    def db_for_read(self, model, **hints):
        return "sandbox" if model._meta.app_label in SANDBOX_APPS else None

    db_for_write = db_for_read

    def allow_relation(self, obj1, obj2, **hints):
        same = (obj1._meta.app_label in SANDBOX_APPS) == (obj2._meta.app_label in SANDBOX_APPS)
        return True if same else False

    def allow_migrate(self, db, app_label, **hints):
        if app_label in SANDBOX_APPS:
            return db == "sandbox"
        return db != "sandbox"
