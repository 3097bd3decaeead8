"""The partner API, included by corridor/urls.py under ``/api/``."""

from django.urls import path
from drf_spectacular.views import SpectacularAPIView

from sagas import api

urlpatterns = [
    path("remittances", api.RemittanceListView.as_view(), name="remittances"),
    path("remittances/<int:saga_id>", api.RemittanceDetailView.as_view(), name="remittance"),
    path("schema/", SpectacularAPIView.as_view(), name="api-schema"),
]
