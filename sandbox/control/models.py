from django.db import models


class FaultSwitch(models.Model):
    """A fault knob. ``times`` None = on until cleared; otherwise fires that many times."""

    name = models.CharField(max_length=100, unique=True)
    params = models.JSONField(default=dict)
    times = models.IntegerField(null=True)
    fired = models.IntegerField(default=0)

    class Meta:
        db_table = "sandbox_fault_switches"
