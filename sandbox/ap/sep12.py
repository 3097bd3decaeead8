"""SEP-12 of the AP stand-in: ``GET / PUT /ap/sep/sep12/customer`` and ``DELETE
/ap/sep/sep12/customer/{account}``, forwarded to the anchor's customer callbacks
(``{SANDBOX_CALLBACK_URL}/customer``, the callback JWT) as AP-4.3.0 ``Sep12Service`` /
``RestCustomerIntegration`` do (SEP31-RECEIVE.md §5.1-5.5). AP stores no customer: every
call is a callback.

Identity (§5.2, ``Sep12Service#validateRequestAndTokenAccounts`` / ``...Memos`` /
``#updateRequestMemoAndMemoType``):

- the SEP-10 token is required (403 ``forbidden`` without); ``account`` defaults to the
  token's account and another one is 403 ``The account specified does not match
  authorization token``;
- a token carrying a memo (``account:memo``) fixes the memo: a request without one gets
  it, another one is 403 ``The memo specified does not match the memo ID authorized via
  SEP-10``;
- ``memo_type`` defaults to ``id``; a memo that does not parse as its type is 400
  ``Invalid 'memo' for 'memo_type'``;
- ``transaction_id``: the SEP-31 transaction must be the caller's (else 404
  ``transaction (id=X) is not found``); AP then forwards ``customers.receiver.id`` when
  ``type`` is exactly ``sep31-receiver`` and ``customers.sender.id`` for any other type
  (§5.2: any other string silently means "sender"), in place of the request's ``id``.

``PUT`` (JSON, ``application/x-www-form-urlencoded`` or ``multipart/form-data``) binds
the body to the fixed field list of ``Sep12PutCustomerRequest`` (:data:`PUT_FIELDS`):
every other name is dropped silently (§5.6: ``pan``, ``ifsc``, ``organization.*``,
``family_name``, ``mobile_number_format``, ...). ``birth_date``, ``id_issue_date`` and
``id_expiration_date`` must be ISO dates (400 ``Invalid 'birth_date'. Expected format:
YYYY-MM-DD``). Binary fields (:data:`BINARY_FIELDS`) are taken only as multipart files;
a text value for one is 400 (AP binds them to ``byte[]``). The callback gets JSON, or,
when a binary field is present, multipart with every non-null field as a part and each
file as ``application/octet-stream`` with the **Java field name** as its filename
(``photoIdFront``; ``RestCustomerIntegration#convertToMultipart``). The SA gets 202
``{"id"}`` and a ``customer_updated`` event (payload ``customer`` ``{"id"}``) is
published after every successful PUT, changed or not (§5.4, §7).

``DELETE /customer/{account}`` (body ``memo``, ``memo_type``, JSON or form): the path
account must be the token's (403 ``Not authorized to delete account [A] with memo [M]``);
AP asks ``GET /customer?account=&memo=&memo_type=`` (no ``type``), answers 404 ``User
not found.`` when that has no ``id``, else calls ``DELETE {callback}/customer/{id}`` and
answers 200.

The anchor's HTTP status -> what the SA sees (§5.5, ``PlatformIntegrationHelper
#httpError``): 400 / 422 -> 400 with its ``error``; 404 -> 404 with its ``error``; 401 ->
403; anything else, an unparsable body or no connection -> 502 ``internal server
error``. A ``GET`` answer without ``status`` is a 502 too (§5.3), and AP re-parses the
answer into its enums (an unknown ``status`` or field type becomes null and is left out).
"""

from __future__ import annotations

import json
import re
from datetime import date
from decimal import Decimal

import httpx
from django.conf import settings

from common.http import tls_context
from sandbox.ap import events
from sandbox.ap.models import ApTransaction
from sandbox.ap.sep import SepError, WebAuth, _memo

DB = "sandbox"
IDENTITY_FIELDS = ("id", "account", "memo", "memo_type", "type", "transaction_id")

# Sep12PutCustomerRequest / PutCustomerRequest (AP-4.3.0), SEP-9 order: natural person
# fields first_name .. referral_id (SEP-9 proof_of_income is AP's photo_proof_of_income),
# financial account fields bank_name .. crypto_memo, then the two verification codes.
TEXT_FIELDS = (
    "last_name", "first_name", "additional_name", "address_country_code",
    "state_or_province", "city", "postal_code", "address", "mobile_number",
    "email_address", "birth_date", "birth_place", "birth_country_code", "tax_id",
    "tax_id_name", "occupation", "employer_name", "employer_address", "language_code",
    "id_type", "id_country_code", "id_issue_date", "id_expiration_date", "id_number",
    "ip_address", "sex", "referral_id",
    "bank_name", "bank_account_type", "bank_account_number", "bank_number",
    "bank_phone_number", "bank_branch_number", "external_transfer_memo", "clabe_number",
    "cbu_number", "cbu_alias", "mobile_money_number", "mobile_money_provider",
    "crypto_address", "crypto_memo",
    "mobile_number_verification", "email_address_verification",
)
BINARY_FIELDS = ("photo_id_front", "photo_id_back", "notary_approval_of_photo_id",
                 "photo_proof_residence", "photo_proof_of_income", "proof_of_liveness")
PUT_FIELDS = IDENTITY_FIELDS + TEXT_FIELDS + BINARY_FIELDS
DATE_FIELDS = ("birth_date", "id_issue_date", "id_expiration_date")
SEP12_STATUSES = ("ACCEPTED", "PROCESSING", "NEEDS_INFO", "REJECTED")
FIELD_TYPES = ("string", "binary", "number", "date")
PROVIDED_STATUSES = ("ACCEPTED", "PROCESSING", "REJECTED", "VERIFICATION_REQUIRED")
RECEIVER = "sep31-receiver"


def java_name(field: str) -> str:
    """The Java field name AP uses as a multipart filename: ``photo_id_front`` ->
    ``photoIdFront``."""
    head, *rest = field.split("_")
    return head + "".join(part.capitalize() for part in rest)


# --------------------------------------------------------------------------- callback


def _callback(method: str, path: str, **kwargs) -> httpx.Response:
    url = settings.SANDBOX_CALLBACK_URL.rstrip("/") + path
    try:
        return httpx.request(method, url, timeout=float(getattr(settings, "HTTP_TIMEOUT_S", 10)),
                             headers={"Authorization": f"Bearer {events.callback_token()}"},
                             verify=tls_context(), **kwargs)
    except httpx.HTTPError:
        raise SepError(502, "internal server error") from None


def _body(response: httpx.Response):
    try:
        return response.json()
    except ValueError:
        return None


def _http_error(response: httpx.Response) -> SepError:
    """``PlatformIntegrationHelper#httpError``: the SA's view of a non-2xx answer."""
    body = _body(response)
    detail = body.get("error") if isinstance(body, dict) else None
    if response.status_code in (400, 422):
        return SepError(400, str(detail or "Bad Request"))
    if response.status_code == 404:
        return SepError(404, str(detail or "Not Found"))
    if response.status_code == 401:
        return SepError(403, "forbidden")
    return SepError(502, "internal server error")


def _customer_answer(body) -> dict:
    """A ``GetCustomerResponse`` as AP re-parses it: known keys, enums checked (unknown
    values left out), ``status`` required (else 502)."""
    if not isinstance(body, dict) or not isinstance(body.get("status"), str):
        raise SepError(502, "internal server error")
    answer: dict = {}
    if body.get("id") is not None:
        answer["id"] = str(body["id"])
    if body["status"] in SEP12_STATUSES:
        answer["status"] = body["status"]
    for key, statuses in (("fields", None), ("provided_fields", PROVIDED_STATUSES)):
        described = body.get(key)
        if not isinstance(described, dict):
            continue
        out = {}
        for name, spec in described.items():
            if not isinstance(spec, dict):
                continue
            item = {k: spec[k] for k in ("description", "choices", "optional", "error")
                    if spec.get(k) is not None}
            if spec.get("type") in FIELD_TYPES:
                item["type"] = spec["type"]
            if statuses is not None and spec.get("status") in statuses:
                item["status"] = spec["status"]
            out[str(name)] = item
        answer[key] = out
    if body.get("message") is not None:
        answer["message"] = str(body["message"])
    return answer


def callback_get(params: dict) -> dict:
    """``GET {callback}/customer`` with ``params`` (None values left out): the parsed
    ``GetCustomerResponse``. Raises SepError as §5.5 maps the anchor's answer."""
    response = _callback("GET", "/customer",
                         params={k: v for k, v in params.items() if v not in (None, "")})
    if response.status_code != 200:
        raise _http_error(response)
    return _customer_answer(_body(response))


# --------------------------------------------------------------------------- identity


def _identity(fields: dict, auth: WebAuth) -> dict:
    """Account, memo and memo type as ``Sep12Service`` settles them; raises SepError."""
    account = fields.get("account") or auth.account
    if account != auth.account:
        raise SepError(403, "The account specified does not match authorization token")
    memo = fields.get("memo") or None
    if auth.memo is not None:
        if memo is None:
            memo = auth.memo
        elif memo != auth.memo:
            raise SepError(403, "The memo specified does not match the memo ID authorized "
                                "via SEP-10")
    memo_type = None
    if memo is not None:
        memo_type = (fields.get("memo_type") or "id").lower()
        try:
            _memo(memo, memo_type)
        except SepError:
            raise SepError(400, "Invalid 'memo' for 'memo_type'") from None
    return {"account": account, "memo": memo, "memo_type": memo_type}


def _customer_of_transaction(transaction_id: str, kind: str | None, auth: WebAuth) -> str | None:
    """The customer id a SEP-31 transaction names for ``kind`` (§5.2)."""
    txn = ApTransaction.objects.using(DB).filter(pk=transaction_id[:64], sep="31").first()
    if txn is None or txn.web_auth_account != auth.account:
        raise SepError(404, f"transaction (id={transaction_id[:64]}) is not found")
    return txn.receiver_id if kind == RECEIVER else txn.sender_id


def _resolved(fields: dict, auth: WebAuth) -> dict:
    request = {k: fields.get(k) or None for k in IDENTITY_FIELDS}
    request.update(_identity(fields, auth))
    if request["transaction_id"]:
        request["id"] = _customer_of_transaction(request["transaction_id"], request["type"],
                                                 auth)
    return request


# --------------------------------------------------------------------------- endpoints


def get_customer(query: dict, auth: WebAuth) -> dict:
    """SA ``GET /sep12/customer``: the anchor's answer, as AP passes it on."""
    request = _resolved(query, auth)
    request["lang"] = query.get("lang") or None
    return callback_get(request)


def bind_put(fields: dict, files: dict[str, bytes]) -> tuple[dict, dict[str, bytes]]:
    """The SA's PUT bound to ``Sep12PutCustomerRequest``: text values of
    :data:`PUT_FIELDS` (others dropped), files of :data:`BINARY_FIELDS` (others
    dropped). Raises SepError 400."""
    text = {}
    for name in IDENTITY_FIELDS + TEXT_FIELDS:
        value = fields.get(name)
        if value is not None:
            text[name] = value
    for name in BINARY_FIELDS:
        if fields.get(name) is not None:
            raise SepError(400, f"'{name}' is a binary field: send it as a "
                                "multipart/form-data file")
    for name in DATE_FIELDS:
        value = text.get(name)
        if value is None:
            continue
        try:
            if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", value):
                raise ValueError
            date.fromisoformat(value)
        except ValueError:
            raise SepError(400, f"Invalid '{name}'. Expected format: YYYY-MM-DD") from None
    return text, {k: v for k, v in files.items() if k in BINARY_FIELDS}


def put_customer(fields: dict, files: dict[str, bytes], auth: WebAuth) -> dict:
    """SA ``PUT /sep12/customer``: forward to ``PUT {callback}/customer`` (JSON, or
    multipart when a file is present), publish ``customer_updated``; ``{"id"}`` for the
    SA's 202. Raises SepError."""
    text, binary = bind_put(fields, files)
    body = {k: v for k, v in text.items() if k not in IDENTITY_FIELDS}
    body.update({k: v for k, v in _resolved(text, auth).items() if v is not None})
    if binary:
        data = {k: str(v) for k, v in body.items()}
        parts = [(name, (java_name(name), content, "application/octet-stream"))
                 for name, content in binary.items()]
        response = _callback("PUT", "/customer", data=data, files=parts)
    else:
        response = _callback("PUT", "/customer", json=body)
    if not 200 <= response.status_code < 300:
        raise _http_error(response)
    answer = _body(response)
    if not isinstance(answer, dict) or not answer.get("id"):
        raise SepError(502, "internal server error")
    customer_id = str(answer["id"])
    events.publish(events.CUSTOMER_UPDATED, customer_object={"id": customer_id})
    return {"id": customer_id}


def delete_customer(account: str, fields: dict, auth: WebAuth) -> None:
    """SA ``DELETE /sep12/customer/{account}``. Raises SepError."""
    memo = fields.get("memo") or None
    if account != auth.account or (auth.memo is not None and memo not in (None, auth.memo)):
        raise SepError(403, f"Not authorized to delete account [{account}] with memo "
                            f"[{memo}]")
    identity = _identity({"account": account, "memo": memo,
                          "memo_type": fields.get("memo_type")}, auth)
    found = callback_get(identity)
    if not found.get("id"):
        raise SepError(404, "User not found.")
    response = _callback("DELETE", f"/customer/{found['id']}")
    if not 200 <= response.status_code < 300:
        raise _http_error(response)


def text_fields(content_type: str, raw: bytes, post) -> dict:
    """The SA's fields as strings from a JSON object, or from the parsed form
    (``post``). Raises SepError 400 for a body that is not a JSON object."""
    if content_type == "application/json":
        try:
            body = json.loads(raw or b"{}", parse_float=Decimal)
        except (ValueError, UnicodeDecodeError):
            raise SepError(400, "Your request body is wrong in some way.") from None
        if not isinstance(body, dict):
            raise SepError(400, "Your request body is wrong in some way.")
        return {str(k): (("true" if v else "false") if isinstance(v, bool) else str(v))
                for k, v in body.items() if v is not None and not isinstance(v, dict | list)}
    return {k: post.get(k) for k in post}


def callback_status(params: dict) -> str:
    """The raw ``status`` text of ``GET {callback}/customer`` (for
    ``notify_customer_info_updated``, which parses it with ``Sep12Status.valueOf``).
    Raises SepError for a failed call or an answer without ``status``."""
    response = _callback("GET", "/customer",
                         params={k: v for k, v in params.items() if v not in (None, "")})
    if response.status_code != 200:
        raise _http_error(response)
    body = _body(response)
    if not isinstance(body, dict) or not isinstance(body.get("status"), str):
        raise SepError(502, "internal server error")
    return body["status"]
