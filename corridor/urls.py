from django.conf import settings
from django.contrib import admin
from django.urls import include, path

from corridor import metrics, views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("health/", views.health, name="health"),
    path("health/ready", views.health_ready, name="health-ready"),
    path("metrics", metrics.metrics_view, name="metrics"),
    path("", include("anchor.urls", namespace="anchor")),
    path("", include("payouts.urls", namespace="payouts")),
    path("api/", include("sagas.urls")),
]

if settings.CORRIDOR_BENCH_NOOP:
    urlpatterns.append(path("bench/noop", views.bench_noop))

handler404 = "corridor.views.not_found"
