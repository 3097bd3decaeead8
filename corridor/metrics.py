"""Prometheus metrics at ``GET /metrics``: django-prometheus's request, response and
exception metrics (its two middlewares), plus Corridor's own.

Computed from the database at scrape time (:class:`CorridorCollector`; the same
numbers whichever process serves the scrape):

- ``corridor_deposit_releases{status}``: ``deposit_releases`` rows by status;
- ``corridor_withdrawal_payouts{status}``: ``withdrawal_payouts`` rows by status;
- ``corridor_sagas{status}``: ``sagas`` rows by status;
- ``corridor_reconciler_lag_seconds``: age of the oldest open release (``submitting``,
  ``submitted``, ``failed``), 0 when none; the reconciler re-drives a healthy one
  within RECONCILER_AGE_S + RECONCILER_PERIOD_S;
- ``corridor_poller_lag_seconds{queue}``: ``payout_processing`` = age of the oldest
  payout still ``processing`` (bounded by the provider's settlement window);
  ``withdrawal_awaiting`` = age of the oldest USDC receipt on chain whose withdrawal
  has no payout yet (verified or waiting for more), 0 when none;
- ``corridor_oldest_stuck_seconds{kind}``: what ``/health/ready`` reports as
  ``oldest_stuck`` (release, payout, saga: :func:`stuck_ages`), 0 when none;
- ``corridor_stranded{kind}``: rows owed to a customer with no owner past their
  kind's threshold (corridor/stranded.py ``stranded_counts``; 0 once settled);
- ``corridor_channels{state}``: channel accounts ``in_flight`` / ``free`` / ``retired``;
  ``corridor_channel_xlm{address}``: each one's XLM for fees as last read from Horizon
  (``manage.py channels list`` and ``create`` refresh it);
  ``corridor_channel_refusals``: claims refused for want of a free channel (a Redis
  counter shared by every process; -1 when Redis cannot be read);
- ``corridor_treasury_balance{account,currency,side}``: the float of the distribution
  account (USDC) and RazorpayX (INR), ``books`` and ``outside`` (the SEP-24 pages'
  cached read or the last reconciliation's; no network at scrape time);
  ``corridor_treasury_float_low{account,currency}``: 1 below its floor
  (TREASURY_FLOOR_*), the alert; ``corridor_treasury_breaks_open``: open breaks;
- ``corridor_metrics_scrape_errors``: 1 when the database could not be read this scrape.

Counted where they happen (per process; under gunicorn, gunicorn.conf.py sets
``PROMETHEUS_MULTIPROC_DIR`` so that ``/metrics`` adds every worker's up):

- ``corridor_webhooks_total{source,outcome}``: Razorpay pay-in (``razorpay``) and
  RazorpayX payout (``razorpayx``) webhooks, by outcome (``recorded``, ``duplicate``,
  ``invalid_signature``, ``too_large`` (a body over 1 MB: 413, unread), ``rejected``
  (signed but never storable: acknowledged, in the
  review queue), ``processing->completed``, ...);
- ``corridor_ap_events_total{outcome}``: AP callback events (``release_scheduled``,
  ``ignored``, ``duplicate``, ``unauthorized``, ``rejected``).

Every query is served by an index on the open statuses, except the three counts by
status, which read the status column of their table once per scrape.
"""

from __future__ import annotations

import hmac
import logging
import os

from django.conf import settings
from django.db import connection
from django.http import HttpResponse
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    generate_latest,
    multiprocess,
)
from prometheus_client.core import GaugeMetricFamily

from corridor import stranded

log = logging.getLogger(__name__)

WEBHOOKS = Counter("corridor_webhooks", "Provider webhooks received, by source and outcome.",
                   ["source", "outcome"])
AP_EVENTS = Counter("corridor_ap_events", "Anchor Platform callback events, by outcome.",
                    ["outcome"])

RELEASE_STATUSES = ("submitting", "submitted", "failed", "completed", "manual_review")
PAYOUT_STATUSES = ("processing", "completed", "failed", "manual_review", "reversed")
SAGA_STATUSES = ("running", "completed", "compensating", "compensated", "manual_review")

_OLDEST_OPEN_RELEASE = """
SELECT EXTRACT(EPOCH FROM clock_timestamp() - MIN(created_at)) FROM deposit_releases
WHERE status IN ('submitting', 'submitted', 'failed')"""
_OLDEST_PROCESSING_PAYOUT = """
SELECT EXTRACT(EPOCH FROM clock_timestamp() - MIN(created_at)) FROM withdrawal_payouts
WHERE status = 'processing'"""
# Due and nobody holds a live lease: what the resume sweep should have picked up.
_OLDEST_STUCK_SAGA = """
SELECT EXTRACT(EPOCH FROM clock_timestamp()
                         - MIN(GREATEST(wake_at, COALESCE(lease_until, wake_at))))
FROM sagas
WHERE status IN ('running', 'compensating') AND wake_at <= clock_timestamp()
  AND (lease_owner = '' OR lease_until <= clock_timestamp())"""
_OLDEST_UNPAID_RECEIPT = """
SELECT EXTRACT(EPOCH FROM clock_timestamp() - MIN(r.created_at))
FROM withdrawal_requests w
JOIN stellar_receipts r
  ON r.memo = w.memo AND r.memo_type = COALESCE(NULLIF(w.memo_type, ''), 'id')
 AND r.to_account = w.destination
WHERE w.status IN ('awaiting_funds', 'funds_verified') AND w.funds_requested_at IS NOT NULL
  AND NOT EXISTS (SELECT 1 FROM withdrawal_payouts p WHERE p.transaction_id = w.transaction_id)
"""


def _scalar(sql: str) -> float | None:
    with connection.cursor() as cursor:
        cursor.execute(sql)
        value = cursor.fetchone()[0]
    return None if value is None else round(max(float(value), 0.0), 1)


def _counts(table: str) -> dict[str, int]:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT status, COUNT(*) FROM {table} GROUP BY status")  # noqa: S608
        return {status: count for status, count in cursor.fetchall()}


_CHANNELS = """
SELECT address, xlm_balance,
       CASE WHEN retired_at IS NOT NULL THEN 'retired'
            WHEN leased_by IS NOT NULL AND leased_until > now() THEN 'in_flight'
            ELSE 'free' END
FROM stellar_source_accounts"""


def _channels() -> tuple[dict[str, int], list[tuple[str, float]]]:
    """Channel accounts by state, and each one's last known XLM (one small table)."""
    states: dict[str, int] = {}
    xlm: list[tuple[str, float]] = []
    with connection.cursor() as cursor:
        cursor.execute(_CHANNELS)
        for address, balance, state in cursor.fetchall():
            states[state] = states.get(state, 0) + 1
            if balance is not None:
                xlm.append((address, float(balance)))
    return states, xlm


def stuck_ages() -> dict[str, float | None]:
    """Seconds since the oldest stuck row of each kind began waiting, None when none:
    ``release`` open (not completed / manual_review) since its claim, ``payout``
    ``processing`` since its claim, ``saga`` running or compensating, due, with no
    live lease, since it became due or its lease lapsed."""
    return {"release": _scalar(_OLDEST_OPEN_RELEASE),
            "payout": _scalar(_OLDEST_PROCESSING_PAYOUT),
            "saga": _scalar(_OLDEST_STUCK_SAGA)}


class CorridorCollector:
    """Corridor's gauges, read from the database at each scrape."""

    def describe(self):
        # Names only: registering must not touch the database.
        return [f for f, _ in self._families()]

    @staticmethod
    def _families():
        return [
            (GaugeMetricFamily("corridor_deposit_releases",
                               "Deposit releases (deposit_releases) by status.",
                               labels=["status"]), "releases"),
            (GaugeMetricFamily("corridor_withdrawal_payouts",
                               "Withdrawal payouts (withdrawal_payouts) by status.",
                               labels=["status"]), "payouts"),
            (GaugeMetricFamily("corridor_sagas", "Sagas by status.", labels=["status"]),
             "sagas"),
            (GaugeMetricFamily("corridor_reconciler_lag_seconds",
                               "Age of the oldest open deposit release, 0 when none."),
             "reconciler"),
            (GaugeMetricFamily("corridor_poller_lag_seconds",
                               "Withdrawal poller lag: oldest processing payout and oldest "
                               "on-chain receipt without a payout, 0 when none.",
                               labels=["queue"]), "poller"),
            (GaugeMetricFamily("corridor_oldest_stuck_seconds",
                               "Age of the oldest stuck release, payout and saga (as "
                               "/health/ready reports), 0 when none.", labels=["kind"]),
             "stuck"),
            (GaugeMetricFamily("corridor_stranded",
                               "Owed rows with no owner past their threshold, by kind "
                               "(corridor/stranded.py), 0 once settled.", labels=["kind"]),
             "stranded"),
            (GaugeMetricFamily("corridor_channels",
                               "Channel accounts by state: in_flight (an envelope that may "
                               "still land), free, retired.", labels=["state"]), "channels"),
            (GaugeMetricFamily("corridor_channel_xlm",
                               "XLM of each channel account (pays its fees), as Horizon "
                               "last showed it.", labels=["address"]), "channel_xlm"),
            (GaugeMetricFamily("corridor_channel_refusals",
                               "Release claims refused so far because every channel had "
                               "an envelope in flight (-1: Redis unreachable)."),
             "refusals"),
            (GaugeMetricFamily("corridor_treasury_balance",
                               "Float of the watched accounts: the books (ledger) and the "
                               "outside (last read: cached or the last reconciliation).",
                               labels=["account", "currency", "side"]), "treasury"),
            (GaugeMetricFamily("corridor_treasury_float_low",
                               "1 when a watched account is below its floor "
                               "(TREASURY_FLOOR_*): top it up.",
                               labels=["account", "currency"]), "float_low"),
            (GaugeMetricFamily("corridor_treasury_breaks_open",
                               "Open reconciliation breaks (treasury/reconcile.py)."),
             "breaks"),
            (GaugeMetricFamily("corridor_metrics_scrape_errors",
                               "1 when the database could not be read for this scrape."),
             "errors"),
        ]

    def collect(self):
        families = dict((key, family) for family, key in self._families())
        try:
            releases = _counts("deposit_releases")
            payouts = _counts("withdrawal_payouts")
            sagas = _counts("sagas")
            stuck = stuck_ages()
            awaiting = _scalar(_OLDEST_UNPAID_RECEIPT)
            strand = stranded.stranded_counts()
            channel_states, channel_xlm = _channels()
            from treasury import floats as treasury_floats
            from treasury.models import Break

            watched = treasury_floats.floats()  # no network: cached or last run's reads
            breaks_open = Break.objects.filter(status=Break.Status.OPEN).count()
        except Exception as exc:  # a scrape reports the failure instead of failing
            log.warning("metrics: database not readable: %s", type(exc).__name__)
            families["errors"].add_metric([], 1)
            yield families["errors"]
            return
        for key, counts, statuses in (("releases", releases, RELEASE_STATUSES),
                                      ("payouts", payouts, PAYOUT_STATUSES),
                                      ("sagas", sagas, SAGA_STATUSES)):
            for status in sorted(set(statuses) | set(counts)):
                families[key].add_metric([status], counts.get(status, 0))
        families["reconciler"].add_metric([], stuck["release"] or 0.0)
        families["poller"].add_metric(["payout_processing"], stuck["payout"] or 0.0)
        families["poller"].add_metric(["withdrawal_awaiting"], awaiting or 0.0)
        for kind in ("release", "payout", "saga"):
            families["stuck"].add_metric([kind], stuck[kind] or 0.0)
        for kind, count in strand.items():
            families["stranded"].add_metric([kind], count)
        for state in ("in_flight", "free", "retired"):
            families["channels"].add_metric([state], channel_states.get(state, 0))
        for address, xlm in channel_xlm:
            families["channel_xlm"].add_metric([address], xlm)
        from anchor import stellar

        refusals = stellar.channel_refusals()
        families["refusals"].add_metric([], -1 if refusals is None else refusals)
        for f in watched:
            families["treasury"].add_metric([f.account, f.currency, "books"], float(f.books))
            if f.outside is not None:
                families["treasury"].add_metric([f.account, f.currency, "outside"],
                                                float(f.outside))
            families["float_low"].add_metric([f.account, f.currency], 1 if f.low else 0)
        families["breaks"].add_metric([], breaks_open)
        families["errors"].add_metric([], 0)
        yield from families.values()


COLLECTOR = CorridorCollector()
REGISTRY.register(COLLECTOR)


def _refusal(request) -> HttpResponse | None:
    """None when the scrape may proceed; else the 401 / 403 to answer."""
    token = settings.METRICS_TOKEN
    if not token:
        if getattr(settings, "CORRIDOR_ENV", "development") == "production":
            return HttpResponse("metrics disabled: METRICS_TOKEN is not set\n", status=403,
                                content_type="text/plain")
        return None
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(),
                                                          token.encode()):
        return None
    response = HttpResponse("bearer token required\n", status=401, content_type="text/plain")
    response["WWW-Authenticate"] = 'Bearer realm="metrics"'
    return response


def scrape_allowed(request) -> bool:
    """Whether ``request`` may read internal figures: the rule of ``/metrics``
    (``METRICS_TOKEN`` as a bearer token; no token: development only)."""
    return _refusal(request) is None


def metrics_view(request):
    """``GET /metrics``: the Prometheus text format.

    Access: with ``METRICS_TOKEN`` set, only ``Authorization: Bearer <METRICS_TOKEN>``
    (compared in constant time) gets the metrics, anything else 401. Without it, open
    in development and refused (403) in production (``CORRIDOR_ENV=production``).

    Content: the default registry, or, under ``PROMETHEUS_MULTIPROC_DIR`` (gunicorn
    with several workers; gunicorn.conf.py prepares it), every worker's counters
    merged by prometheus_client's ``MultiProcessCollector`` -- dead workers' included
    -- plus Corridor's database gauges once (django-prometheus's own view would leave
    those out there)."""
    refused = _refusal(request)
    if refused is not None:
        return refused
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        registry.register(COLLECTOR)
    else:
        registry = REGISTRY
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
