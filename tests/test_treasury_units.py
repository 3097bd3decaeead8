"""Pure pieces of the treasury's reads and reports (no database, no sandbox): the XLM
balance Horizon shows on a native line, and the figures written for an accountant
(the daily report's CSV, a run's compared balances) in plain notation, never
Decimal's exponent form (``0E-7`` is what ``str`` gives for a zero sum of 7-dp
amounts)."""

import csv
import io
import json
from datetime import date
from decimal import Decimal

from stellar_sdk import Asset

from anchor import stellar
from tests.conftest import reference_path
from treasury import reconcile, report


def test_the_xlm_balance_is_read_from_horizons_native_line(monkeypatch):
    """A native balance line has ``asset_type: native`` and no ``asset_code`` /
    ``asset_issuer`` (Horizon's own answer, reference/horizon/account.json): reading
    it by code ``XLM`` found nothing, so every XLM balance the reconciliation reported
    (distribution, hub, channels) was 0."""
    account = json.loads(reference_path("horizon", "account.json").read_text())
    native = next(line["balance"] for line in account["balances"]
                  if line["asset_type"] == "native")
    monkeypatch.setattr(stellar, "load_account", lambda address: account)

    assert stellar.asset_balance(account["id"], Asset.native()) == Decimal(native)
    aqua = Asset("AQUA", "GBNZILSTVQZ4R7IKQDGHYGY2QXL5QOFJYQMXPKWRRM5PAV7Y4M67AQUA")
    assert stellar.asset_balance(account["id"], aqua) == Decimal("85729.1030749")


def test_the_daily_report_csv_writes_zero_balances_in_plain_notation(monkeypatch):
    zero = Decimal("21174.0000000") - Decimal("21174.0000000")  # Decimal('0E-7')
    assert str(zero) == "0E-7"
    day = date(2026, 12, 6)
    monkeypatch.setattr(report, "daily_report", lambda d: [report.ReportRow(
        day, "owed:deposits", "INR", Decimal(0), Decimal("21174.0000000"),
        Decimal("-21174.0000000"), zero, 0, 0)])

    rows = list(csv.DictReader(io.StringIO(report.report_csv(day))))

    assert rows[0]["closing"] == "0.0000000"
    assert "E" not in report.report_csv(day)


def test_a_runs_compared_balances_are_stored_in_plain_notation():
    zero = Decimal("0.0000000") - Decimal("0E-7")
    stored = reconcile._balance(zero, Decimal("0"), Decimal("0.00"), Decimal(0), zero)

    assert stored["books"] == "0.0000000" and stored["difference"] == "0.0000000"
    assert not any("E" in value for value in stored.values())
