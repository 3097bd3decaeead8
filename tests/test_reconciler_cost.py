"""The reconciler's cost grows with the stuck rows, not with the table (DESIGN.md §4):
its query is served by the partial index over the open statuses."""

from datetime import timedelta

import pytest
from django.conf import settings
from django.db import connection
from django.utils import timezone

from anchor.models import DepositRelease
from tests.factories import DepositReleaseFactory


@pytest.mark.django_db
def test_stuck_release_query_uses_the_partial_index():
    DepositReleaseFactory.create_batch(3000)
    DepositReleaseFactory.create_batch(3, status=DepositRelease.Status.SUBMITTING)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE deposit_releases")
    cutoff = timezone.now() - timedelta(seconds=settings.RECONCILER_AGE_S)
    query = DepositRelease.objects.filter(
        status__in=DepositRelease.OPEN_STATUSES, updated_at__lt=cutoff).order_by("updated_at")

    plan = query.explain()

    assert "deposit_releases_open_idx" in plan, plan
