"""Transaction listing of the Platform API (NOTES §1.8).

AP-4.3.0 ``PlatformController.getTransactions`` + ``AllTransactionsRepositoryImpl``:
``sep`` required (``6``, ``24``, ``31``, also ``sep_24``), ``order_by`` ``created_at``
(default; the column is ``started_at``) | ``transfer_received_at`` |
``user_action_required_by``, ``order`` ``asc`` (default) | ``desc``, ``statuses``
comma-separated or repeated, ``page_number`` default 0, ``page_size`` default 20; values
match case-insensitively. SQL: ``ORDER BY <col> <dir> NULLS LAST, id ASC LIMIT size
OFFSET number*size``. SEP-24 and SEP-31 exist here; ``sep=6`` lists nothing.

Errors: a missing ``sep`` is 400 ``The "sep" parameter is missing.``; a value Spring
cannot convert (and Spring Data's paging guards) end in AP's catch-all handler, 500
``{"error": <message>}`` (messages reproduced in Spring's form).
"""

from __future__ import annotations

from django.db.models import F

from sandbox.ap.models import ApTransaction
from sandbox.ap.objects import platform_object

DB = "sandbox"

SEPS = {"6": "6", "sep_6": "6", "24": "24", "sep_24": "24", "31": "31", "sep_31": "31"}
ORDER_BY = {
    "created_at": "started_at",
    "transfer_received_at": "transfer_received_at",
    "user_action_required_by": "user_action_required_by",
}
# AP SepTransactionStatus: every SEP's statuses (a SEP-6/31 name is valid, matches nothing).
STATUSES = {
    "pending_sender", "pending_stellar", "pending_customer_info_update",
    "pending_transaction_info_update", "pending_receiver", "pending_external", "completed",
    "refunded", "expired", "error", "pending_anchor", "pending_trust", "pending_user",
    "pending_user_transfer_start", "pending_user_transfer_complete", "incomplete",
    "no_market", "too_small", "too_large", "on_hold",
}
_TYPES = {
    "sep": "org.stellar.anchor.api.platform.TransactionsSeps",
    "order_by": "org.stellar.anchor.api.platform.TransactionsOrderBy",
    "order": "org.springframework.data.domain.Sort$Direction",
    "statuses": "java.util.List",
    "page_number": "java.lang.Integer",
    "page_size": "java.lang.Integer",
}


class ListingError(Exception):
    """A refused listing: HTTP ``status`` and AP's ``message``."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


def _mismatch(param: str, cause: str) -> ListingError:
    return ListingError(500, f"Method parameter '{param}': Failed to convert value of type "
                             f"'java.lang.String' to required type '{_TYPES[param]}'; {cause}")


def _integer(param: str, value: str | None, default: int) -> int:
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise _mismatch(param, f'For input string: "{value}"') from None


def find(*, sep: str | None, order_by: str | None = None, order: str | None = None,
         statuses: str | list[str] | None = None, page_number: str | None = None,
         page_size: str | None = None) -> list[dict]:
    """One page of transaction objects (§1.7). Raises ListingError."""
    if not sep:
        raise ListingError(400, 'The "sep" parameter is missing.')
    sep_value = SEPS.get(sep.strip().lower())
    if sep_value is None:
        raise _mismatch("sep", f"No matching constant for [{sep}]")

    column = ORDER_BY.get((order_by or "created_at").strip().lower())
    if column is None:
        raise _mismatch("order_by", f"No matching constant for [{order_by}]")
    direction = (order or "asc").strip().lower()
    if direction not in ("asc", "desc"):
        raise _mismatch("order", f"Invalid value '{order}' for orders given; Has to be either "
                                 "'desc' or 'asc' (case insensitive)")

    wanted: list[str] = []
    items = statuses if isinstance(statuses, list) else [statuses or ""]
    for item in items:
        for name in (item or "").split(","):
            name = name.strip()
            if not name:
                continue
            if name.lower() not in STATUSES:
                raise _mismatch("statuses", f"No matching constant for [{name}]")
            wanted.append(name.lower())

    number = _integer("page_number", page_number, 0)
    size = _integer("page_size", page_size, 20)
    if number < 0:
        raise ListingError(500, "Page index must not be less than zero")
    if size < 1:
        raise ListingError(500, "Page size must not be less than one")
    if sep_value not in ("24", "31"):
        return []

    rows = ApTransaction.objects.using(DB).filter(sep=sep_value)
    if wanted:
        rows = rows.filter(status__in=wanted)
    key = F(column).asc(nulls_last=True) if direction == "asc" else F(column).desc(
        nulls_last=True)
    rows = rows.order_by(key, "id")[number * size:(number + 1) * size]
    return [platform_object(txn) for txn in rows]
