from django.contrib import admin
from django.urls import include, path

from corridor import views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("health/", views.health, name="health"),
    path("", include("anchor.urls", namespace="anchor")),
    path("", include("payouts.urls", namespace="payouts")),
]
