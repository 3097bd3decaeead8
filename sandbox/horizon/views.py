"""HTTP endpoints of the Horizon stand-in (served under ``/horizon/`` by
``python manage.py sandbox``). Thin: parse, call ``service`` / read rows, render.

``Latest-Ledger`` is sent on the state endpoint ``/accounts/{id}`` only, as Horizon's
``StateMiddleware`` sets it (stellar-horizon ``internal/httpx/middleware.go`` and
``router.go`` @ 2abda012; stellar-docs ``structure/consistency.mdx``): root, history
endpoints (transactions, payments, operations, ledgers) and submissions carry none.
Each request is served by one node (``service.node_view``: the lag faults); errors are
problem+json (``render.problem``). Paging (stellar-horizon
``internal/db2/page_query.go``): ``cursor`` exclusive (a paging token, empty, or
``now``), ``order`` ``asc`` (default) | ``desc``, ``limit`` 1..200 (default 10);
``include_failed`` (default false) on transactions and operations lists; ``join=
transactions`` on operations and payments.

Not served: effects, offers, trades, claimable balances, paths, SSE streaming
(``Accept: text/event-stream`` gets the plain JSON page).
"""

from __future__ import annotations

import functools
import json
import logging

from django.conf import settings
from django.db import transaction as db_transaction
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.views.decorators.csrf import csrf_exempt
from stellar_sdk import StrKey

from sandbox.control import faults
from sandbox.horizon import core, models, render, service

log = logging.getLogger(__name__)

DB = service.DB
MAX_LIMIT = 200
DEFAULT_LIMIT = 10
MAX_CURSOR = 2**63 - 1


class BadParam(Exception):
    """A bad query parameter: answered as 400 ``bad_request`` naming the field."""
    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


def base_url(request: HttpRequest) -> str:
    """Absolute URL of this Horizon's root without the trailing slash, from the
    request's host ("http://127.0.0.1:8100/horizon")."""
    return request.build_absolute_uri(reverse("sandbox_horizon:root")).rstrip("/")


def horizon_view(view):
    """Create the world on first use, pick the node that serves the request
    (``request.node``) and turn unexpected errors into Horizon's ``server_error``
    problem."""

    @csrf_exempt
    @functools.wraps(view)
    def wrapper(request: HttpRequest, *args, **kwargs) -> HttpResponse:
        try:
            service.ensure_world()
            request.node = service.node_view(
                client_name=request.headers.get("X-Client-Name", ""))
            response = view(request, *args, **kwargs)
        except BadParam as exc:
            response = render.bad_request(exc.field, exc.reason)
        except Exception:
            log.exception("sandbox horizon: %s %s failed", request.method, request.path)
            response = render.server_error()
        return response

    return wrapper


# --- paging ----------------------------------------------------------------------

def _page_params(request: HttpRequest) -> tuple[str, int | None, int, str]:
    """(cursor as given, cursor as int or None, limit, order). Raises BadParam."""
    cursor = request.GET.get("cursor", "")
    order = request.GET.get("order", "") or "asc"
    if order not in ("asc", "desc"):
        raise BadParam("order", "order: invalid value, must be one of asc, desc")
    raw_limit = request.GET.get("limit", "")
    try:
        limit = int(raw_limit) if raw_limit else DEFAULT_LIMIT
    except ValueError:
        raise BadParam("limit", "unparseable value")
    if not 1 <= limit <= MAX_LIMIT:
        raise BadParam("limit", f"limit argument must be between 1 and {MAX_LIMIT}")
    if cursor == "":
        value = None
    elif cursor == "now":
        value = MAX_CURSOR if order == "asc" else None
    else:
        try:
            value = int(cursor)
        except ValueError:
            raise BadParam("cursor", "unparseable value")
        if value < 0:
            raise BadParam("cursor", "cursor must be a non-negative number")
    return cursor, value, limit, order


def _bool_param(request: HttpRequest, name: str) -> bool:
    value = request.GET.get(name, "")
    if value in ("", "false"):
        return False
    if value == "true":
        return True
    raise BadParam(name, "must be true or false")


def _join_param(request: HttpRequest) -> bool:
    value = request.GET.get("join", "")
    if value not in ("", "transactions"):
        raise BadParam("join", "Accepted values: transactions")
    return value == "transactions"


def _paged(queryset: QuerySet, key: str, cursor: int | None, limit: int, order: str) -> list:
    if order == "asc":
        if cursor is not None:
            queryset = queryset.filter(**{f"{key}__gt": cursor})
        queryset = queryset.order_by(key)
    else:
        if cursor is not None:
            queryset = queryset.filter(**{f"{key}__lt": cursor})
        queryset = queryset.order_by(f"-{key}")
    return list(queryset[:limit])


def _page_response(request: HttpRequest, records: list[dict], cursor: str, limit: int,
                   order: str, extra: dict) -> HttpResponse:
    url = request.build_absolute_uri(request.path)
    return render.hal(render.page(url=url, extra=extra, records=records, cursor=cursor,
                                  limit=limit, order=order))


def _valid_account(account_id: str) -> str:
    if not StrKey.is_valid_ed25519_public_key(account_id):
        raise BadParam("account_id", "Account ID must start with `G` and contain 56 "
                                     "alphanum characters")
    return account_id


def _valid_hash(tx_hash: str) -> str:
    if len(tx_hash) != 64 or any(c not in "0123456789abcdefABCDEF" for c in tx_hash):
        raise BadParam("tx_id", "Transaction hash must be a hex-encoded, lowercase "
                                "SHA-256 hash")
    return tx_hash.lower()


def _known_account(account_id: str) -> bool:
    return (models.TransactionParticipant.objects.using(DB).filter(account_id=account_id)
            .exists() or models.Account.objects.using(DB).filter(pk=account_id).exists())


def _transactions_page(request: HttpRequest, queryset: QuerySet, *,
                       failed_filter: bool = True) -> HttpResponse:
    cursor, value, limit, order = _page_params(request)
    include_failed = _bool_param(request, "include_failed")
    extra = {"include_failed": "true"} if include_failed else {}
    if failed_filter and not include_failed:
        queryset = queryset.filter(successful=True)
    base = base_url(request)
    rows = _paged(queryset, "id", value, limit, order)
    records = [render.transaction_resource(tx, base) for tx in rows]
    return _page_response(request, records, cursor, limit, order, extra)


def _operations_page(request: HttpRequest, queryset: QuerySet, *, payments: bool,
                     failed_filter: bool = True) -> HttpResponse:
    cursor, value, limit, order = _page_params(request)
    include_failed = _bool_param(request, "include_failed")
    join = _join_param(request)
    extra = {}
    if include_failed:
        extra["include_failed"] = "true"
    if join:
        extra["join"] = "transactions"
    queryset = queryset.select_related("transaction")
    if payments:
        queryset = queryset.filter(is_payment=True)
    if failed_filter and not include_failed:
        queryset = queryset.filter(successful=True)
    base = base_url(request)
    rows = _paged(queryset, "id", value, limit, order)
    joined: dict[int, dict] = {}
    records = []
    for op in rows:
        embedded = None
        if join:
            if op.transaction_id not in joined:
                joined[op.transaction_id] = render.transaction_resource(op.transaction, base)
            embedded = joined[op.transaction_id]
        records.append(render.operation_record(op, base, embedded))
    return _page_response(request, records, cursor, limit, order, extra)


def _node(request: HttpRequest) -> service.NodeView:
    return getattr(request, "node", None) or service.NodeView()


def _transactions(request: HttpRequest) -> QuerySet:
    """Transactions the serving node has ingested."""
    queryset = models.Transaction.objects.using(DB)
    node = _node(request)
    if node.history_lag:
        queryset = queryset.filter(ledger__lte=node.history_height())
    return queryset


def _operations(request: HttpRequest) -> QuerySet:
    queryset = models.Operation.objects.using(DB)
    node = _node(request)
    if node.history_lag:
        queryset = queryset.filter(transaction__ledger__lte=node.history_height())
    return queryset


def _ledgers(request: HttpRequest) -> QuerySet:
    queryset = models.Ledger.objects.using(DB)
    node = _node(request)
    if node.history_lag:
        queryset = queryset.filter(sequence__lte=node.history_height())
    return queryset


# --- endpoints -------------------------------------------------------------------

@horizon_view
def root(request: HttpRequest) -> HttpResponse:
    """GET / : network passphrase, latest ledger (the serving node's history height;
    ``core_latest_ledger`` is core's, never behind), links."""
    elder = models.Ledger.objects.using(DB).order_by("sequence").first()
    latest = service.latest_ledger()
    node = _node(request)
    ingested = models.Ledger.objects.using(DB).filter(
        sequence__lte=node.history_height(latest.sequence)).order_by("-sequence").first()
    return render.hal(render.root_resource(
        base_url(request), ingested, elder.sequence, service.passphrase(),
        core_latest=latest.sequence, ingest_latest=node.state_height(latest.sequence)))


@horizon_view
def account(request: HttpRequest, account_id: str) -> HttpResponse:
    """GET /accounts/{id}: 404 ``not_found`` for an account that does not exist. A
    state endpoint: ``Latest-Ledger`` names the ledger the answer is as of (a node
    behind answers from its own height, ``service.account_at``)."""
    _valid_account(account_id)
    node = _node(request)
    with db_transaction.atomic(using=DB):  # one snapshot: the height and the rows agree
        latest = service.latest_ledger()
        height = node.state_height(latest.sequence)
        if node.state_lag:
            found = service.account_at(account_id, height)
        else:
            row = models.Account.objects.using(DB).filter(pk=account_id).first()
            found = None if row is None else (row, list(
                models.Trustline.objects.using(DB).filter(account_id=account_id)
                .order_by("asset_code", "asset_issuer")))
    response = render.not_found() if found is None else render.hal(
        render.account_resource(found[0], found[1], base_url(request)))
    response["Latest-Ledger"] = str(height)
    return response


@horizon_view
def account_transactions(request: HttpRequest, account_id: str) -> HttpResponse:
    """GET /accounts/{id}/transactions: transactions the account took part in (404 for an account
    never seen)."""
    if not _known_account(_valid_account(account_id)):
        return render.not_found()
    return _transactions_page(request, _transactions(request).filter(
        participants__account_id=account_id))


@horizon_view
def account_payments(request: HttpRequest, account_id: str) -> HttpResponse:
    """GET /accounts/{id}/payments: payments sent and received (404 for an account never seen)."""
    if not _known_account(_valid_account(account_id)):
        return render.not_found()
    return _operations_page(request, _operations(request).filter(
        participants__account_id=account_id), payments=True)


@horizon_view
def account_operations(request: HttpRequest, account_id: str) -> HttpResponse:
    """GET /accounts/{id}/operations."""
    if not _known_account(_valid_account(account_id)):
        return render.not_found()
    return _operations_page(request, _operations(request).filter(
        participants__account_id=account_id), payments=False)


@horizon_view
def transactions(request: HttpRequest) -> HttpResponse:
    """GET: all transactions, paged. POST: submit (form field ``tx``)."""
    if request.method == "POST":
        return _submit(request)
    return _transactions_page(request, _transactions(request))


def _form_body_ok(request: HttpRequest) -> bool:
    content_type = request.META.get("CONTENT_TYPE", "")
    if not content_type:
        return True
    media_type = content_type.split(";", 1)[0].strip().lower()
    return media_type in ("application/x-www-form-urlencoded", "multipart/form-data")


def _outcome_response(tx: models.Transaction, envelope_xdr: str, base: str) -> HttpResponse:
    if tx.successful:
        return render.hal(render.transaction_resource(tx, base))
    return render.transaction_failed(envelope_xdr, tx.result_xdr)


def _submit(request: HttpRequest) -> HttpResponse:
    """POST /transactions (stellar-horizon ``actions/submit_transaction.go``): 200
    transaction, 400 ``transaction_failed`` / ``transaction_malformed``, 415, or 504
    ``transaction_submission_timeout``. Blocks until the transaction is in a ledger."""
    if not _form_body_ok(request):
        return render.unsupported_media_type()
    if faults.take(service.FAULT_STALE_HISTORY) is not None:
        return render.stale_history()
    raw = request.POST.get("tx", "")
    try:
        env = core.parse_envelope(raw, service.passphrase())
    except core.MalformedEnvelope:
        return render.transaction_malformed(raw)
    outcome = service.submit(env)
    base = base_url(request)
    node = _node(request)
    if isinstance(outcome, service.Known):
        if not node.sees(outcome.tx):
            return _unseen_outcome(outcome.tx, env, node, base)
        return _outcome_response(outcome.tx, env.raw, base)
    if isinstance(outcome, service.Refused):
        return render.transaction_failed(env.raw, outcome.result.to_xdr())
    tx = service.await_transaction(outcome.hash, outcome.deadline, node)
    if tx is None or outcome.respond_504:
        return render.submission_timeout(env.hash, env.raw)
    return _outcome_response(tx, env.raw, base)


def _unseen_outcome(tx: models.Transaction, env: core.Envelope, node: service.NodeView,
                    base: str) -> HttpResponse:
    """An envelope that is in a ledger this node has not ingested: Horizon misses it in
    its own database and hands it to core, which answers txBAD_SEQ (the sequence is
    used); Horizon then waits until its account state shows the sequence used (or it
    caught up) and looks the hash up once more (stellar-horizon ``txsub/system.go``;
    stellar/go #2628, PR #2877): still unseen -> 400 ``tx_bad_seq``; the submission
    timeout first -> 504."""
    deadline = service._now() + service._submission_timeout()
    while True:
        tx.refresh_from_db(using=DB)
        if node.sees(tx):
            return _outcome_response(tx, env.raw, base)
        latest = service.latest_ledger().sequence
        seen = (service.account_at(env.source, node.state_height(latest))
                if node.state_lag else
                (models.Account.objects.using(DB).filter(pk=env.source).first(), []))
        if seen is not None and seen[0] is not None and seen[0].sequence >= env.sequence:
            return render.transaction_failed(env.raw, core.bad_seq_result().to_xdr())
        if service._now() >= deadline:
            return render.submission_timeout(env.hash, env.raw)
        service.wait_for_close(service.close_count(), 0.1)


@horizon_view
def transactions_async(request: HttpRequest) -> HttpResponse:
    """POST /transactions_async (stellar-horizon ``actions/submit_transaction_async.go``):
    core's answer without waiting (201 PENDING, 409 DUPLICATE, 503 TRY_AGAIN_LATER, 400
    ERROR with ``error_result_xdr``), with every fault of the synchronous endpoint (see
    ``service``): a dropped envelope still answers PENDING; 504-after-apply answers a 504
    problem at once; stale history a 503 problem (not a ``tx_status`` body)."""
    if request.method != "POST":
        return render.not_found()
    if not _form_body_ok(request):
        return render.unsupported_media_type()
    if faults.take(service.FAULT_STALE_HISTORY) is not None:
        return render.stale_history()
    raw = request.POST.get("tx", "")
    try:
        env = core.parse_envelope(raw, service.passphrase())
    except core.MalformedEnvelope:
        return render.transaction_malformed(raw)
    outcome = service.submit(env)
    if isinstance(outcome, service.Pending) and outcome.respond_504:
        return render.submission_timeout(env.hash, env.raw)
    body: dict = {"hash": env.hash}
    if isinstance(outcome, service.Known):
        # Core sees an applied envelope's sequence as used.
        body.update(tx_status="ERROR", error_result_xdr=core.bad_seq_result().to_xdr())
        status = 400
    elif isinstance(outcome, service.Refused):
        body.update(tx_status="ERROR", error_result_xdr=outcome.result.to_xdr())
        status = 400
    elif outcome.status == "duplicate":
        body["tx_status"], status = "DUPLICATE", 409
    elif outcome.status == "try_again_later":
        body["tx_status"], status = "TRY_AGAIN_LATER", 503
    else:
        body["tx_status"], status = "PENDING", 201
    ordered = {"tx_status": body["tx_status"], "hash": body["hash"]}
    if "error_result_xdr" in body:
        ordered["error_result_xdr"] = body["error_result_xdr"]
    return render.hal(ordered, status=status)


@horizon_view
def transaction(request: HttpRequest, tx_hash: str) -> HttpResponse:
    """GET /transactions/{hash}: 404 until the transaction is in a closed ledger (and once more per
    hash under ``horizon.lookup_404_once``)."""
    tx = _transactions(request).filter(hash=_valid_hash(tx_hash)).first()
    if tx is None:
        return render.not_found()
    if service.lookup_hidden(tx.hash):
        return render.not_found()
    return render.hal(render.transaction_resource(tx, base_url(request)))


def _transaction_or_none(request: HttpRequest, tx_hash: str) -> models.Transaction | None:
    return _transactions(request).filter(hash=_valid_hash(tx_hash)).first()


@horizon_view
def transaction_payments(request: HttpRequest, tx_hash: str) -> HttpResponse:
    """GET /transactions/{hash}/payments."""
    tx = _transaction_or_none(request, tx_hash)
    if tx is None:
        return render.not_found()
    # Operations of one transaction are listed whether it failed or not.
    return _operations_page(request, _operations(request).filter(transaction=tx), payments=True,
                            failed_filter=False)


@horizon_view
def transaction_operations(request: HttpRequest, tx_hash: str) -> HttpResponse:
    """GET /transactions/{hash}/operations."""
    tx = _transaction_or_none(request, tx_hash)
    if tx is None:
        return render.not_found()
    return _operations_page(request, _operations(request).filter(transaction=tx), payments=False,
                            failed_filter=False)


@horizon_view
def payments(request: HttpRequest) -> HttpResponse:
    """GET /payments: create_account, payment (and other payment-like) operations."""
    return _operations_page(request, _operations(request), payments=True)


@horizon_view
def operations(request: HttpRequest) -> HttpResponse:
    """GET /operations."""
    return _operations_page(request, _operations(request), payments=False)


@horizon_view
def operation(request: HttpRequest, op_id: str) -> HttpResponse:
    """GET /operations/{id}."""
    if not op_id.isdigit():
        raise BadParam("id", "unparseable value")
    row = _operations(request).select_related("transaction").filter(pk=int(op_id)).first()
    if row is None:
        return render.not_found()
    return render.hal(render.operation_record(row, base_url(request)))


@horizon_view
def ledgers(request: HttpRequest) -> HttpResponse:
    """GET /ledgers (``order=desc&limit=1`` is stellar-sdk's ``fetch_base_fee``)."""
    cursor, value, limit, order = _page_params(request)
    base = base_url(request)
    rows = _paged(_ledgers(request), "paging_token", value, limit, order)
    records = [render.ledger_record(row, base) for row in rows]
    return _page_response(request, records, cursor, limit, order, {})


@horizon_view
def ledger(request: HttpRequest, sequence: int) -> HttpResponse:
    """GET /ledgers/{sequence} (``closed_at``: when it closed, RFC 3339)."""
    row = _ledgers(request).filter(pk=sequence).first()
    if row is None:
        return render.not_found()
    return render.hal(render.ledger_record(row, base_url(request)))


@horizon_view
def ledger_transactions(request: HttpRequest, sequence: int) -> HttpResponse:
    """GET /ledgers/{sequence}/transactions."""
    if not _ledgers(request).filter(pk=sequence).exists():
        return render.not_found()
    return _transactions_page(request, _transactions(request).filter(ledger=sequence))


@horizon_view
def ledger_payments(request: HttpRequest, sequence: int) -> HttpResponse:
    """GET /ledgers/{sequence}/payments."""
    if not _ledgers(request).filter(pk=sequence).exists():
        return render.not_found()
    return _operations_page(request, _operations(request).filter(transaction__ledger=sequence),
                            payments=True)


@horizon_view
def ledger_operations(request: HttpRequest, sequence: int) -> HttpResponse:
    """GET /ledgers/{sequence}/operations."""
    if not _ledgers(request).filter(pk=sequence).exists():
        return render.not_found()
    return _operations_page(request, _operations(request).filter(transaction__ledger=sequence),
                            payments=False)


@horizon_view
def fee_stats(request: HttpRequest) -> HttpResponse:
    """GET /fee_stats over the last 5 ledgers."""
    recent = list(models.Ledger.objects.using(DB).order_by("-sequence")[:5])
    txs = list(_transactions(request).filter(ledger__gte=recent[-1].sequence))
    return render.hal(render.fee_stats(recent, txs))


@horizon_view
def friendbot(request: HttpRequest) -> HttpResponse:
    """GET|POST /friendbot?addr=G...: create the account with 10,000 XLM (testnet
    friendbot). 400 ``account already funded to starting balance`` when it exists."""
    address = request.GET.get("addr") or request.POST.get("addr") or ""
    if not StrKey.is_valid_ed25519_public_key(address):
        return render.bad_request("addr", "base32 decode failed: illegal base32 data")
    try:
        result = service.friendbot(address)
    except service.AlreadyFunded:
        return render.bad_request(detail="account already funded to starting balance")
    return _internal_response(result, base_url(request))


def _internal_response(result, base: str) -> HttpResponse:
    if isinstance(result, models.Transaction):
        return _outcome_response(result, result.envelope_xdr, base)
    if isinstance(result, core.TxResult):
        return render.problem("transaction_failed", "Transaction Failed", 400,
                              "The sandbox's own transaction was refused.",
                              {"result_xdr": result.to_xdr(),
                               "result_codes": core.result_codes(result.to_xdr())})
    return render.problem("timeout", "Timeout", 504,
                          "No ledger closed in time (is the sandbox's ledger loop running?).")


@horizon_view
def sandbox_fund(request: HttpRequest) -> HttpResponse:
    """POST /sandbox/fund {"account": "G...", "amount": "100.0000000"} (sandbox only):
    the USDC issuer pays that much USDC to the account, which needs a USDC trustline.
    Answers like POST /transactions (the transaction resource, ``hash`` included)."""
    if request.method != "POST":
        return render.not_found()
    try:
        body = json.loads(request.body or b"{}")
    except ValueError:
        return render.bad_request(detail="body must be JSON")
    address = str(body.get("account", ""))
    if not StrKey.is_valid_ed25519_public_key(address):
        return render.bad_request("account", "must be a G... account id")
    try:
        amount = core.parse_amount(str(body.get("amount", "")))
    except (ValueError, ArithmeticError):
        return render.bad_request("amount", "must be a positive amount with at most 7 "
                                            "decimal places")
    try:
        result = service.fund_usdc(address, amount)
    except service.NoTrustline:
        return render.bad_request(
            "account", f"{address} has no {settings.STELLAR_USDC_CODE} trustline",
            detail=f"The account must trust {settings.STELLAR_USDC_CODE} before it can be "
                   "funded.")
    return _internal_response(result, base_url(request))


@horizon_view
def not_found(request: HttpRequest, rest: str = "") -> HttpResponse:
    """Any other path: Horizon's 404 ``not_found`` problem."""
    return render.not_found()
