"""The partner API (DRF): ``POST /api/remittances``, ``GET /api/remittances/{id}``;
the OpenAPI schema at ``/api/schema/`` (drf-spectacular).

Partners authenticate with ``Authorization: Bearer <API key>`` (``manage.py
create_partner``); no or a wrong key -> 401. ``POST`` needs an ``Idempotency-Key``
header (1-255 printable ASCII characters): the same key with the same body answers the
same remittance (202 again, ``Idempotent-Replayed: true``), with another body 409.
Views parse, call one service of ``sagas.remittances`` and render."""

from __future__ import annotations

import re

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import exceptions, status
from rest_framework.authentication import BaseAuthentication
from rest_framework.permissions import BasePermission
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from anchor.stellar import HorizonUnavailable
from sagas import remittances
from sagas.models import Partner
from sagas.serializers import (
    ErrorSerializer,
    RemittanceCreatedSerializer,
    RemittanceRequestSerializer,
    RemittanceSerializer,
)

_IDEMPOTENCY_KEY = re.compile(r"^[\x21-\x7e]{1,255}$")


class PartnerKeyAuthentication(BaseAuthentication):
    """``Authorization: Bearer cpk_...``: ``request.user`` is the ``Partner``."""

    def authenticate(self, request: Request):
        header = request.headers.get("Authorization", "")
        if not header:
            return None
        scheme, _, key = header.partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            raise exceptions.AuthenticationFailed("use Authorization: Bearer <API key>")
        partner = remittances.partner_authenticate(key.strip())
        if partner is None:
            raise exceptions.AuthenticationFailed("invalid API key")
        return partner, None

    def authenticate_header(self, request: Request) -> str:
        return 'Bearer realm="corridor"'


class PartnerKeyScheme(OpenApiAuthenticationExtension):
    target_class = "sagas.api.PartnerKeyAuthentication"
    name = "partnerKey"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer",
                "description": "the partner's API key (manage.py create_partner)"}


class IsPartner(BasePermission):
    def has_permission(self, request: Request, view) -> bool:
        return isinstance(request.user, Partner)


class _PartnerView(APIView):
    authentication_classes = [PartnerKeyAuthentication]
    permission_classes = [IsPartner]


IDEMPOTENCY_PARAMETER = OpenApiParameter(
    "Idempotency-Key", str, OpenApiParameter.HEADER, required=True,
    description="the partner's key for this request (1-255 printable ASCII characters)")


class RemittanceListView(_PartnerView):
    @extend_schema(
        operation_id="create_remittance", request=RemittanceRequestSerializer,
        parameters=[IDEMPOTENCY_PARAMETER],
        responses={202: RemittanceCreatedSerializer,
                   400: OpenApiResponse(description="invalid request (field -> messages)"),
                   401: ErrorSerializer, 409: ErrorSerializer, 503: ErrorSerializer})
    def post(self, request: Request) -> Response:
        """Create a remittance: the quote is locked now; pay ``amount`` USDC to
        ``hub_account`` with ``memo`` before ``fund_by``."""
        key = request.headers.get("Idempotency-Key", "")
        if not _IDEMPOTENCY_KEY.match(key):
            return Response({"detail": "an Idempotency-Key header (1-255 printable ASCII "
                                       "characters) is required"},
                            status=status.HTTP_400_BAD_REQUEST)
        serializer = RemittanceRequestSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        try:
            saga, created = remittances.remittance_create(
                partner=request.user, idempotency_key=key, order=serializer.validated_data)
        except remittances.IdempotencyConflict as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)
        except HorizonUnavailable:
            return Response({"detail": "Stellar is not reachable; try again with the same "
                                       "Idempotency-Key"},
                            status=status.HTTP_503_SERVICE_UNAVAILABLE)
        body = RemittanceCreatedSerializer(remittances.remittance_summary(saga)).data
        headers = {} if created else {"Idempotent-Replayed": "true"}
        return Response(body, status=status.HTTP_202_ACCEPTED, headers=headers)


class RemittanceDetailView(_PartnerView):
    @extend_schema(operation_id="get_remittance",
                   responses={200: RemittanceSerializer, 401: ErrorSerializer,
                              404: ErrorSerializer})
    def get(self, request: Request, saga_id: int) -> Response:
        """A remittance of this partner: status, steps and ledger bookings."""
        saga = remittances.remittance_for(request.user, saga_id)
        if saga is None:
            return Response({"detail": "not found"}, status=status.HTTP_404_NOT_FOUND)
        return Response(RemittanceSerializer(remittances.remittance_view(saga)).data)
