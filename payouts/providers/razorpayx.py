"""RazorpayX payouts (razorpay/NOTES.md §2). Amounts are integer paise; every create
carries ``X-Payout-Idempotency`` (4-36 characters of ``[A-Za-z0-9-_ ]``: a UUID);
a retry repeats the same key and a byte-identical body; ``reference_id`` is our AP
transaction id (<= 40) and is how we find a payout whose create answer was lost."""

from __future__ import annotations

import json
from urllib.parse import quote

import httpx
from django.conf import settings

from anchor import razorpay as rzp
from common.http import tls_context
from payouts.providers.base import (
    Beneficiary,
    DisburseResult,
    PayoutNotFound,
    ProviderError,
    ProviderPayout,
    RegisteredBeneficiary,
)


def _payout(entity: dict) -> ProviderPayout:
    details = entity.get("status_details") or {}
    return ProviderPayout(payout_id=entity["id"], status=entity.get("status", ""),
                          amount_paise=int(entity.get("amount") or 0),
                          reference=entity.get("reference_id") or "",
                          utr=entity.get("utr") or "", reason=details.get("reason") or "",
                          raw=entity, fees_paise=_paise(entity.get("fees")),
                          tax_paise=_paise(entity.get("tax")))


def _paise(value) -> int | None:
    """An integer paise field of an entity, or None when absent or not an integer."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class RazorpayX:
    name = "razorpayx"
    duplicate_reference = "replay"
    amount_unit = "paise"
    success_can_reverse = True
    failed_statuses = frozenset({"failed", "cancelled", "rejected"})

    def _client(self) -> httpx.Client:
        return httpx.Client(base_url=settings.RAZORPAY_API_URL.rstrip("/"),
                            auth=(settings.RAZORPAY_KEY_ID, settings.RAZORPAY_KEY_SECRET),
                            timeout=settings.HTTP_TIMEOUT_S, verify=tls_context())

    def _post(self, path: str, body: dict, headers: dict | None = None) -> httpx.Response:
        with self._client() as client:
            # One serialisation, reused byte for byte on every retry (NOTES §2.5).
            content = json.dumps(body, separators=(",", ":"), sort_keys=True).encode()
            return client.post(path, content=content,
                               headers={"Content-Type": "application/json", **(headers or {})})

    def register_beneficiary(self, *, beneficiary: Beneficiary, reference: str) -> tuple[str, str]:
        """Contact + fund account; identical details return the existing ones (§2.2-2.3).
        Raises ProviderError for refused details, rzp.RazorpayError when unreachable."""
        try:
            contact = self._post("/v1/contacts", {"name": beneficiary.name, "type": "customer",
                                                  "reference_id": reference[:40]})
            if contact.status_code >= 500:
                raise rzp.RazorpayError(f"contacts: {contact.status_code}")
            if contact.status_code >= 400:
                raise ProviderError(_describe(contact))
            contact_id = contact.json()["id"]
            if beneficiary.kind == "vpa":
                body = {"contact_id": contact_id, "account_type": "vpa",
                        "vpa": {"address": beneficiary.vpa}}
            else:
                body = {"contact_id": contact_id, "account_type": "bank_account",
                        "bank_account": {"name": beneficiary.name, "ifsc": beneficiary.ifsc,
                                         "account_number": beneficiary.account_number}}
            fund = self._post("/v1/fund_accounts", body)
        except httpx.HTTPError as exc:
            raise rzp.RazorpayError(f"register_beneficiary: {type(exc).__name__}") from exc
        if fund.status_code >= 500:
            raise rzp.RazorpayError(f"fund_accounts: {fund.status_code}")
        if fund.status_code >= 400:
            raise ProviderError(_describe(fund))
        return contact_id, fund.json()["id"]

    def disburse(self, *, fund_account_id: str, amount_paise: int, reference: str,
                 idempotency_key: str, narration: str, mode: str = "IMPS") -> DisburseResult:
        body = {
            "account_number": settings.RAZORPAYX_ACCOUNT_NUMBER,
            "fund_account_id": fund_account_id, "amount": amount_paise, "currency": "INR",
            "mode": mode, "purpose": "payout", "queue_if_low_balance": True,
            "reference_id": reference[:40], "narration": narration[:30],
        }
        try:
            response = self._post("/v1/payouts", body,
                                  headers={"X-Payout-Idempotency": idempotency_key})
        except httpx.HTTPError as exc:
            return DisburseResult("unknown", reason=f"{type(exc).__name__}: {exc}")
        if response.status_code in (200, 201):
            return DisburseResult("accepted", payout=_payout(response.json()))
        if response.status_code == 409 or response.status_code >= 500:
            # 409: the same key is still in flight (NOTES §2.5); 5xx: it may exist.
            return DisburseResult("unknown", reason=f"HTTP {response.status_code}")
        return DisburseResult("rejected", reason=_describe(response))

    def find_by_reference(self, reference: str) -> list[ProviderPayout]:
        try:
            with self._client() as client:
                response = client.get("/v1/payouts", params={
                    "account_number": settings.RAZORPAYX_ACCOUNT_NUMBER,
                    "reference_id": reference[:40], "count": 100})
        except httpx.HTTPError as exc:
            raise rzp.RazorpayError(f"find_by_reference: {type(exc).__name__}") from exc
        if response.status_code != 200:
            raise rzp.RazorpayError(f"find_by_reference: HTTP {response.status_code}")
        return [_payout(item) for item in response.json().get("items", [])]

    def beneficiaries_by_reference(self, reference: str) -> list[RegisteredBeneficiary]:
        """``GET /v1/contacts?reference_id=`` (NOTES §2.2) then ``GET /v1/fund_accounts?
        contact_id=`` for each (docs ``api/x/fund-accounts/fetch-all``): the payee a
        withdrawal registered (``register_beneficiary`` sets ``reference_id``), to rebuild
        a request whose row a failover lost (issue 25 §2). The full account number is
        used only to mask it. Raises rzp.RazorpayError."""
        found: list[RegisteredBeneficiary] = []
        try:
            with self._client() as client:
                contacts = self._items(client, "/v1/contacts",
                                       {"reference_id": reference[:40], "count": 100})
                for contact in contacts:
                    if contact.get("reference_id") != reference[:40]:
                        continue
                    for fund in self._items(client, "/v1/fund_accounts",
                                            {"contact_id": contact["id"], "count": 100}):
                        payee = _beneficiary(contact.get("name") or "", fund)
                        if payee is not None:
                            found.append(RegisteredBeneficiary(
                                contact_id=contact["id"], fund_account_id=fund["id"],
                                beneficiary=payee, active=bool(fund.get("active", True))))
        except httpx.HTTPError as exc:
            raise rzp.RazorpayError(f"beneficiaries_by_reference: {type(exc).__name__}") \
                from exc
        return found

    @staticmethod
    def _items(client: httpx.Client, path: str, params: dict) -> list[dict]:
        response = client.get(path, params=params)
        if response.status_code != 200:
            raise rzp.RazorpayError(f"{path}: HTTP {response.status_code}")
        try:
            return list(response.json().get("items", []))
        except (ValueError, AttributeError) as exc:
            raise rzp.RazorpayError(f"{path}: unreadable answer: {exc}") from exc

    def fetch(self, payout_id: str) -> ProviderPayout:
        """``GET /v1/payouts/{id}`` (NOTES §2.9). A 400/404 to a GET by id means no such
        payout for our key (Razorpay: 400 "The id provided does not exist"): raises
        PayoutNotFound. 5xx, 401, 429, timeouts and unreadable answers raise
        rzp.RazorpayError (ask again later)."""
        try:
            with self._client() as client:
                response = client.get(f"/v1/payouts/{quote(payout_id, safe='')}")
        except httpx.HTTPError as exc:
            raise rzp.RazorpayError(f"fetch: {type(exc).__name__}") from exc
        if response.status_code in (400, 404):
            raise PayoutNotFound(f"fetch {payout_id}: {_describe(response)}")
        if response.status_code != 200:
            raise rzp.RazorpayError(f"fetch {payout_id}: HTTP {response.status_code}")
        try:
            entity = response.json()
            if not isinstance(entity, dict) or not isinstance(entity.get("id"), str):
                raise ValueError("not a payout entity")
            return _payout(entity)
        except (ValueError, TypeError) as exc:
            raise rzp.RazorpayError(f"fetch {payout_id}: unreadable answer: {exc}") from exc

    def verify_webhook(self, body: bytes, signature: str) -> bool:
        return rzp.verify_webhook(body, signature)


def _beneficiary(name: str, fund: dict) -> Beneficiary | None:
    """The payee of a fund account entity (bank account or VPA); None for another type."""
    if fund.get("account_type") == "vpa":
        return Beneficiary(name=name, kind="vpa", vpa=(fund.get("vpa") or {}).get("address", ""))
    if fund.get("account_type") == "bank_account":
        bank = fund.get("bank_account") or {}
        return Beneficiary(name=name, kind="bank_account", ifsc=bank.get("ifsc", ""),
                           account_number=bank.get("account_number", ""))
    return None


def _describe(response: httpx.Response) -> str:
    try:
        error = response.json().get("error", {})
        return f"{error.get('field') or ''}: {error.get('description') or response.text[:200]}"
    except ValueError:
        return response.text[:200]


def provider() -> RazorpayX:
    return RazorpayX()
