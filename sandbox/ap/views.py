"""HTTP surfaces of the AP stand-in: thin views over ``rpc``, ``listing``, ``sep`` and
``events``.

Platform server (``/ap/platform/``), NOTES §1-2: ``POST /`` JSON-RPC,
``GET /transactions/{id}``, ``GET /transactions``, ``GET /health`` (no auth). Auth is
``Authorization: Bearer <JWT HS256 AP_PLATFORM_AUTH_SECRET>``: signature and ``exp``
only, as AP-4.3.0 ``PlatformAuthJwtFilter`` (no clock skew); anything else is 403
``{"error":"forbidden"}``. Fault ``ap.require_aud``: a token without
``aud: "platform_api"`` is refused too (post-4.3.0 PR #1965).

Fault ``ap.stale_status``: the REST reads show ``status: pending_anchor`` for the ids in
``params.transaction_ids`` (all when absent), although the transaction moved on. It acts
on these reads only: the RPC ``get_transaction`` and the payment observer's matching see
the real status.

Fault ``ap.rpc_answer_lost``: a status RPC named in ``params.methods`` (default
``notify_onchain_funds_sent``) is applied, then its answer is lost (504 from the proxy in
front of AP), and the next ``params.stale_reads`` (3) REST reads of that transaction lag
behind it (``ap.stale_status`` armed for its id): the caller's repeat meets -32600 and
a read that still shows ``pending_anchor`` (issue 25 §3, the release notify's
contradiction check).

Sandbox-only inspection: ``GET /ap/sandbox/events``, ``GET /ap/sandbox/observer``.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import threading
from decimal import Decimal
from functools import wraps

import jwt
from django.conf import settings
from django.http import HttpResponse, HttpResponseNotAllowed, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from sandbox.ap import listing, rpc, sep, sep10, sep12, sep31, sep38
from sandbox.ap.models import ApEvent, ApObservedPayment, ApObserverState, ApTransaction
from sandbox.ap.objects import instant, platform_object, sep24_object
from sandbox.control import faults

log = logging.getLogger(__name__)

DB = "sandbox"
STARTED_AT = dt.datetime.now(dt.UTC)
FORBIDDEN = {"error": "forbidden"}
BAD_BODY = {"error": "Your request body is wrong in some way."}


def _platform_authorized(request) -> bool:
    header = request.headers.get("Authorization", "")
    if not header.startswith("Bearer "):
        return False
    try:
        claims = jwt.decode(header[len("Bearer "):], settings.AP_PLATFORM_AUTH_SECRET,
                            algorithms=["HS256"], leeway=0,
                            options={"verify_aud": False, "verify_iat": False})
    except jwt.InvalidTokenError:
        return False
    audience = claims.get("aud")
    has_aud = audience == "platform_api" or (
        isinstance(audience, list) and "platform_api" in audience)
    if not has_aud and faults.take("ap.require_aud") is not None:
        return False
    return True


def platform_auth(view):
    @wraps(view)
    def wrapper(request, *args, **kwargs):
        if not _platform_authorized(request):
            return JsonResponse(FORBIDDEN, status=403)
        return view(request, *args, **kwargs)

    return wrapper


def _stale(obj: dict) -> dict:
    params = faults.peek("ap.stale_status")
    if params is None:
        return obj
    wanted = params.get("transaction_ids")
    if wanted is not None and obj["id"] not in wanted:
        return obj
    if faults.take("ap.stale_status") is None:
        return obj
    return {**obj, "status": "pending_anchor"}


@csrf_exempt
@platform_auth
def rpc_view(request):
    """``POST /ap/platform/``: a JSON array of JSON-RPC requests -> array of replies."""
    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    try:
        batch = json.loads(request.body, parse_float=Decimal)
    except (ValueError, UnicodeDecodeError):
        return JsonResponse(BAD_BODY, status=400)
    if not isinstance(batch, list) or not all(isinstance(item, dict) for item in batch):
        return JsonResponse(BAD_BODY, status=400)
    replies = rpc.handle_batch(batch)
    lost = faults.peek("ap.rpc_answer_lost")
    if lost is not None:
        methods = lost.get("methods") or ["notify_onchain_funds_sent"]
        applied = [item["params"]["transaction_id"]
                   for item, reply in zip(batch, replies, strict=True)
                   if item.get("method") in methods and "result" in reply
                   and isinstance(item.get("params"), dict)]
        if applied and faults.take("ap.rpc_answer_lost") is not None:
            faults.set_fault("ap.stale_status", times=int(lost.get("stale_reads", 3)),
                             params={"transaction_ids": applied})
            return HttpResponse("upstream request timeout", status=504)
    return JsonResponse(replies, safe=False)


@platform_auth
def transaction_view(request, transaction_id: str):
    """``GET /ap/platform/transactions/{id}`` (AP ``TransactionService.findTransaction``)."""
    if request.method != "GET":
        return HttpResponseNotAllowed(["GET"])
    txn = ApTransaction.objects.using(DB).filter(pk=transaction_id).first()
    if txn is None:
        return JsonResponse({"error": f"transaction (id={transaction_id}) is not found"},
                            status=404)
    return JsonResponse(_stale(platform_object(txn)))


@platform_auth
def transactions_view(request):
    """``GET /ap/platform/transactions?sep=24&...`` -> ``{"records": [...]}``."""
    if request.method != "GET":
        return HttpResponseNotAllowed(["GET"])
    query = request.GET
    try:
        records = listing.find(
            sep=query.get("sep"), order_by=query.get("order_by"), order=query.get("order"),
            statuses=query.getlist("statuses") or None,
            page_number=query.get("page_number"), page_size=query.get("page_size"))
    except listing.ListingError as exc:
        return JsonResponse({"error": exc.message}, status=exc.status)
    return JsonResponse({"records": [_stale(record) for record in records]})


def health_view(request):
    """``GET /ap/platform/health``: always 200, no auth (AP exempts /health)."""
    elapsed = (dt.datetime.now(dt.UTC) - STARTED_AT).total_seconds()
    return JsonResponse({"started_at": instant(STARTED_AT),
                         "elapsed_time_ms": int(elapsed * 1000), "number_of_checks": 0,
                         "checks": {}, "version": "4.3.0"})


# ------------------------------------------------------------------------- SEP server


def _fields(request) -> dict:
    """The wallet's request as AP binds it: JSON object or form fields, values as text."""
    if request.content_type == "application/json":
        try:
            body = json.loads(request.body or b"{}", parse_float=Decimal)
        except (ValueError, UnicodeDecodeError):
            raise sep.SepError(400, BAD_BODY["error"]) from None
        if not isinstance(body, dict):
            raise sep.SepError(400, BAD_BODY["error"])
        return {str(k): _form_text(v) for k, v in body.items() if not isinstance(v, dict | list)}
    return {k: request.POST.get(k) for k in request.POST}


def _form_text(value) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _sep_error(exc: sep.SepError) -> JsonResponse:
    return JsonResponse({"error": exc.message}, status=exc.status)


def _cors(response):
    """SEP endpoints are called from browser wallets (SEP-1/10/24: CORS on every
    response, any origin; they are bearer-token APIs, no cookies)."""
    response["Access-Control-Allow-Origin"] = "*"
    response["Access-Control-Allow-Headers"] = "Authorization, Content-Type"
    response["Access-Control-Allow-Methods"] = "GET, POST, PUT, DELETE, OPTIONS"
    return response


def cors(view):
    """Answer a preflight ``OPTIONS`` with 204 and add CORS headers to ``view``'s."""
    def wrapped(request, *args, **kwargs):
        if request.method == "OPTIONS":
            return _cors(HttpResponse(status=204))
        return _cors(view(request, *args, **kwargs))
    wrapped.__doc__, wrapped.__name__ = view.__doc__, view.__name__
    return csrf_exempt(wrapped)


@cors
def sep10_view(request):
    """SEP-10 (sandbox/ap/sep10.py): ``GET`` a challenge, ``POST {"transaction"}`` the
    signed challenge for a token."""
    try:
        if request.method == "GET":
            return JsonResponse(sep10.challenge(
                request, account=request.GET.get("account"),
                home=request.GET.get("home_domain"),
                client_domain=request.GET.get("client_domain"), memo=request.GET.get("memo")))
        if request.method == "POST":
            return JsonResponse(sep10.token(request, _fields(request).get("transaction")))
    except sep.SepError as exc:
        return _sep_error(exc)
    return HttpResponseNotAllowed(["GET", "POST"])


def stellar_toml_view(request):
    """``GET /.well-known/stellar.toml`` (SEP-1), with CORS as SEP-1 requires."""
    return _cors(HttpResponse(sep10.stellar_toml(request), content_type="text/plain"))


@csrf_exempt
def auth_view(request):
    """``POST /ap/sep/sandbox-token``: NOT SEP-10: the drivers' shortcut to a sandbox
    token for any account, without a challenge (tests and demos only)."""
    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    try:
        fields = _fields(request)
        token = sep.issue_token(account=fields.get("account"), memo=fields.get("memo"),
                                client_domain=fields.get("client_domain"),
                                client_name=fields.get("client_name"))
    except sep.SepError as exc:
        return _sep_error(exc)
    return JsonResponse({"token": token})


def _interactive(request, kind: str):
    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    try:
        auth = sep.read_token(request.headers.get("Authorization"))
        answer = sep.start_interactive(kind=kind, auth=auth, request=_fields(request),
                                       client_ip=request.META.get("REMOTE_ADDR"))
    except sep.SepError as exc:
        return _sep_error(exc)
    return JsonResponse(answer)


@cors
def deposit_interactive_view(request):
    """``POST /ap/sep/transactions/deposit/interactive``."""
    return _interactive(request, "deposit")


@cors
def withdraw_interactive_view(request):
    """``POST /ap/sep/transactions/withdraw/interactive``."""
    return _interactive(request, "withdrawal")


@cors
def sep_transaction_view(request):
    """``GET /ap/sep/transaction?id=|stellar_transaction_id=|external_transaction_id=``."""
    if request.method != "GET":
        return HttpResponseNotAllowed(["GET"])
    try:
        auth = sep.read_token(request.headers.get("Authorization"))
        txn = sep.find_for_wallet(
            auth, transaction_id=request.GET.get("id"),
            stellar_transaction_id=request.GET.get("stellar_transaction_id"),
            external_transaction_id=request.GET.get("external_transaction_id"))
    except sep.SepError as exc:
        return _sep_error(exc)
    return JsonResponse({"transaction": sep24_object(txn)})


@cors
def sep24_info_view(request):
    """SEP-24 ``GET /info``."""
    if request.method != "GET":
        return HttpResponseNotAllowed(["GET"])
    return JsonResponse(sep.sep24_info())


@cors
def sep24_transactions_view(request):
    """SEP-24 ``GET /transactions`` (sandbox/ap/sep.py ``wallet_transactions``)."""
    if request.method != "GET":
        return HttpResponseNotAllowed(["GET"])
    try:
        auth = sep.read_token(request.headers.get("Authorization"))
        rows = sep.wallet_transactions(auth, request.GET)
    except sep.SepError as exc:
        return _sep_error(exc)
    return JsonResponse({"transactions": [sep24_object(txn) for txn in rows]})


def _optional_auth(request) -> sep.WebAuth | None:
    header = request.headers.get("Authorization")
    return sep.read_token(header) if header else None


def _sep38(request, method: str, answer):
    if request.method != method:
        return HttpResponseNotAllowed([method])
    try:
        return answer()
    except sep.SepError as exc:
        return _sep_error(exc)


@csrf_exempt
def sep38_info_view(request):
    """``GET /ap/sep/sep38/info``."""
    return _sep38(request, "GET", lambda: JsonResponse(sep38.info()))


@csrf_exempt
def sep38_prices_view(request):
    """``GET /ap/sep/sep38/prices``."""
    return _sep38(request, "GET", lambda: JsonResponse(
        sep38.prices(request.GET.dict(), _optional_auth(request))))


@csrf_exempt
def sep38_price_view(request):
    """``GET /ap/sep/sep38/price``."""
    return _sep38(request, "GET", lambda: JsonResponse(
        sep38.price(request.GET.dict(), _optional_auth(request))))


@csrf_exempt
def sep38_quote_view(request):
    """``POST /ap/sep/sep38/quote`` (SEP-10 token): 201 with the firm quote."""
    return _sep38(request, "POST", lambda: JsonResponse(
        sep38.post_quote(_fields(request), sep.read_token(request.headers.get("Authorization"))),
        status=201))


@csrf_exempt
def sep38_quote_get_view(request, quote_id: str):
    """``GET /ap/sep/sep38/quote/{id}`` (SEP-10 token of its creator)."""
    return _sep38(request, "GET", lambda: JsonResponse(
        sep38.get_quote(quote_id, sep.read_token(request.headers.get("Authorization")))))


# ------------------------------------------------------------------------- SEP-12


def _auth(request) -> sep.WebAuth:
    return sep.read_token(request.headers.get("Authorization"))


def _put_fields(request) -> tuple[dict, dict[str, bytes]]:
    """A PUT body as AP binds it: JSON, form-urlencoded or multipart (text parts and
    files). Raises SepError 400."""
    if request.content_type == "multipart/form-data":
        try:
            form, files = request.parse_file_upload(request.META, request)
        except Exception:  # Django's multipart parser errors: a malformed body
            raise sep.SepError(400, BAD_BODY["error"]) from None
        return {k: form.get(k) for k in form}, {k: files[k].read() for k in files}
    if request.content_type == "application/x-www-form-urlencoded":
        from django.http import QueryDict

        form = QueryDict(request.body, encoding="utf-8")
        return {k: form.get(k) for k in form}, {}
    return sep12.text_fields("application/json", request.body, None), {}


@csrf_exempt
def sep12_customer_view(request):
    """``GET`` / ``PUT /ap/sep/sep12/customer`` (SEP-10 token), forwarded to the anchor's
    ``/customer`` callback (sandbox/ap/sep12.py)."""
    if request.method not in ("GET", "PUT"):
        return HttpResponseNotAllowed(["GET", "PUT"])
    try:
        auth = _auth(request)
        if request.method == "GET":
            return JsonResponse(sep12.get_customer(request.GET.dict(), auth))
        fields, files = _put_fields(request)
        return JsonResponse(sep12.put_customer(fields, files, auth), status=202)
    except sep.SepError as exc:
        return _sep_error(exc)


@csrf_exempt
def sep12_customer_delete_view(request, account: str):
    """``DELETE /ap/sep/sep12/customer/{account}`` (body ``memo``, ``memo_type``)."""
    if request.method != "DELETE":
        return HttpResponseNotAllowed(["DELETE"])
    try:
        auth = _auth(request)
        fields = _put_fields(request)[0] if request.body else {}
        sep12.delete_customer(account, fields, auth)
    except sep.SepError as exc:
        return _sep_error(exc)
    return JsonResponse({}, status=200)


# ------------------------------------------------------------------------- SEP-31


@csrf_exempt
def sep31_info_view(request):
    """``GET /ap/sep/sep31/info`` (SEP-10 token)."""
    if request.method != "GET":
        return HttpResponseNotAllowed(["GET"])
    try:
        _auth(request)
    except sep.SepError as exc:
        return _sep_error(exc)
    return JsonResponse(sep31.info())


@csrf_exempt
def sep31_transactions_view(request):
    """``POST /ap/sep/sep31/transactions`` (SEP-10 token, JSON): 201 ``{"id"}``."""
    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    try:
        auth = _auth(request)
        try:
            body = json.loads(request.body or b"{}", parse_float=Decimal)
        except (ValueError, UnicodeDecodeError):
            raise sep.SepError(400, BAD_BODY["error"]) from None
        if not isinstance(body, dict):
            raise sep.SepError(400, BAD_BODY["error"])
        answer = sep31.post_transaction(body, auth, client_ip=request.META.get("REMOTE_ADDR"))
    except sep.SepError as exc:
        return _sep_error(exc)
    return JsonResponse(answer, status=201)


def sep31_transaction_view(request, transaction_id: str):
    """``GET /ap/sep/sep31/transactions/{id}`` (SEP-10 token of its creator)."""
    if request.method != "GET":
        return HttpResponseNotAllowed(["GET"])
    try:
        return JsonResponse(sep31.get_transaction(transaction_id, _auth(request)))
    except sep.SepError as exc:
        return _sep_error(exc)


# ------------------------------------------------------------------------- sandbox only


def events_view(request):
    """``GET /ap/sandbox/events[?transaction_id=]``: the event outbox in delivery order,
    with delivery state, for tests (not an AP endpoint)."""
    rows = ApEvent.objects.using(DB).order_by("position")
    if request.GET.get("transaction_id"):
        rows = rows.filter(transaction_id=request.GET["transaction_id"])
    return JsonResponse({"events": [
        {
            "id": str(e.event_id),
            "seq": e.seq,
            "type": e.type,
            "transaction_id": e.transaction_id,
            "status": e.payload.get("transaction", {}).get("status"),
            "created_at": instant(e.created_at),
            "delivered": e.delivered_at is not None,
            "delivered_at": instant(e.delivered_at),
            "lost": e.lost_at is not None,
            "attempts": e.attempts,
            "next_attempt_at": instant(e.next_attempt_at),
            "copies": e.copies,
            "last_status": e.last_status,
            "last_error": e.last_error,
            "attempt_log": e.attempt_log,
            "payload": e.payload,
        }
        for e in rows
    ]})


def observer_view(request):
    """``GET /ap/sandbox/observer[?transaction_id=|stellar_transaction_id=]``: the payment
    observer's stored cursor and the payments it handled, oldest first, each with its
    outcome and the RPC it sent and the reply it ignored (not an AP endpoint)."""
    state = ApObserverState.objects.using(DB).filter(pk=1).first()
    rows = ApObservedPayment.objects.using(DB).order_by("seq")
    if request.GET.get("transaction_id"):
        rows = rows.filter(transaction_id=request.GET["transaction_id"])
    if request.GET.get("stellar_transaction_id"):
        rows = rows.filter(stellar_transaction_id=request.GET["stellar_transaction_id"])
    return JsonResponse({
        "cursor": state.cursor if state else None,
        "payments": [
            {
                "paging_token": p.paging_token,
                "operation_id": p.operation_id,
                "type": p.operation_type,
                "stellar_transaction_id": p.stellar_transaction_id,
                "from": p.from_account,
                "to": p.to_account,
                "to_muxed": p.to_muxed,
                "amount": p.amount,
                "asset": p.asset,
                "memo_type": p.memo_type,
                "memo": p.memo,
                "outcome": p.outcome,
                "transaction_id": p.transaction_id,
                "detail": p.detail,
                "rpc_request": p.rpc_request,
                "rpc_reply": p.rpc_reply,
                "observed_at": instant(p.observed_at),
            }
            for p in rows
        ],
    })


@csrf_exempt
def sandbox_transaction_view(request, transaction_id: str):
    """``POST /ap/sandbox/transactions/{id} {"status"?, "funds_received"?: bool,
    "clear_refunds"?: bool}`` (sandbox only, for tests of the RPC table): put a
    transaction in any status, as AP's deprecated ``PATCH /transactions`` can (NOTES
    §1.8, no state-machine checks), and set or clear the hidden "funds received" flag
    (``transfer_received_at``). Bumps ``version``; publishes nothing. 404 unknown id,
    400 a bad body; 200 with the platform object."""
    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    try:
        body = json.loads(request.body or b"{}")
    except ValueError:
        body = None
    if not isinstance(body, dict):
        return JsonResponse({"error": "the body must be a JSON object"}, status=400)
    changes: dict = {}
    if "status" in body:
        if body["status"] not in listing.STATUSES:
            return JsonResponse({"error": f"unknown status {body['status']!r}"}, status=400)
        changes["status"] = body["status"]
    if "funds_received" in body:
        if not isinstance(body["funds_received"], bool):
            return JsonResponse({"error": "funds_received must be true or false"}, status=400)
        changes["transfer_received_at"] = (dt.datetime.now(dt.UTC) if body["funds_received"]
                                           else None)
    if body.get("clear_refunds") is True:
        changes["refunds"] = None
    from django.db.models import F

    rows = ApTransaction.objects.using(DB).filter(pk=transaction_id[:64])
    if not rows.update(version=F("version") + 1, **changes):
        return JsonResponse({"error": f"transaction (id={transaction_id[:64]}) is not found"},
                            status=404)
    return JsonResponse(platform_object(rows.get()))


_SENDER_RUNS: dict[str, dict] = {}
_SENDER_LOCK = threading.Lock()


def _sender_payment(body: dict):
    from sandbox.sender31 import Payment

    pay = body.get("pay") or {}
    if not isinstance(pay, dict):
        raise ValueError("pay must be an object")
    times = pay.get("times", 1)
    if not isinstance(times, int) or isinstance(times, bool) or not 0 <= times <= 5:
        raise ValueError("pay.times must be an integer from 0 to 5")
    asset = pay.get("asset", "usdc")
    if asset not in ("usdc", "native"):
        raise ValueError("pay.asset must be usdc or native")
    text = {k: (None if pay.get(k) is None else str(pay[k]))
            for k in ("amount", "memo", "destination")}
    return Payment(times=times, asset=asset, **text)


@csrf_exempt
def sender31_send_view(request):
    """``POST /ap/sandbox/sender31/send {"amount"?, "pay"?: {"amount", "times", "memo",
    "asset", "destination"}, "timeout_s"?}`` (sandbox only): the foreign sending anchor
    (sandbox/sender31.py) registers both customers, takes a firm quote and creates the
    SEP-31 transaction now (202 with the ids), then waits in the background up to
    ``timeout_s`` (default 120) for ``pending_sender`` and pays as ``pay`` says. 400 for
    a bad body; the SA's refused step as 502 with the answer it got."""
    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    from sandbox import sender31

    try:
        body = json.loads(request.body or b"{}")
        if not isinstance(body, dict):
            raise ValueError("the body must be a JSON object")
        payment = _sender_payment(body)
        amount = str(body.get("amount", "100"))
        timeout = float(body.get("timeout_s", 120))
        if not 0 < timeout <= 600:
            raise ValueError("timeout_s must be in (0, 600]")
    except ValueError as exc:
        return JsonResponse({"error": str(exc)}, status=400)
    agent = sender31.SendingAnchor(settings.SANDBOX_URL)
    try:
        remittance = agent.start(amount=amount)
    except sender31.SenderError as exc:
        return JsonResponse({"error": str(exc), "status": exc.status, "body": exc.body},
                            status=502)
    run = {"transaction_id": remittance.transaction_id, "sender_id": remittance.sender_id,
           "receiver_id": remittance.receiver_id, "quote_id": remittance.quote["id"],
           "state": "waiting", "hashes": [], "error": None}
    with _SENDER_LOCK:
        _SENDER_RUNS[remittance.transaction_id] = run

    def finish():
        try:
            agent.finish(remittance, payment, timeout=timeout)
            update = {"state": "paid" if remittance.hashes else "not_paid",
                      "hashes": remittance.hashes}
        except Exception as exc:  # reported on the inspection endpoint
            update = {"state": "failed", "error": str(exc)}
        with _SENDER_LOCK:
            run.update(update)

    threading.Thread(target=finish, name="sandbox.sender31", daemon=True).start()
    return JsonResponse(dict(run), status=202)


def sender31_run_view(request, transaction_id: str):
    """``GET /ap/sandbox/sender31/runs/{transaction_id}``: a triggered run's state
    (``waiting`` | ``paid`` | ``not_paid`` | ``failed``), hashes and error, and the
    transaction as AP holds it now (``ap_status``: ``completed``, ``refunded``, ...;
    ``external_transaction_id``: the payout's UTR; ``refunds``)."""
    with _SENDER_LOCK:
        run = _SENDER_RUNS.get(transaction_id)
        run = dict(run) if run else None
    if run is None:
        return JsonResponse({"error": f"no run for {transaction_id[:64]}"}, status=404)
    txn = ApTransaction.objects.filter(id=transaction_id).first()
    if txn is not None:
        current = platform_object(txn)
        run.update(ap_status=current.get("status"),
                   external_transaction_id=current.get("external_transaction_id"),
                   refunds=current.get("refunds"), message=current.get("message"))
    return JsonResponse(run)


@csrf_exempt
def sandbox_reset_view(request):
    """``POST /ap/sandbox/reset``: empty the AP stand-in only (not Horizon, not Razorpay)."""
    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    from sandbox.ap.service import reset

    reset()
    return JsonResponse({"reset": True})
