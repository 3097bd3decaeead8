"""Schemathesis (v4) over real HTTP against the live server: Corridor's own OpenAPI
(``/api/schema/``, the partner API, with a partner key) and the Anchor Platform's
callbacks spec (``bundled-callbacks.yaml`` from ../shared/reference) against
``/callbacks``, authenticated with the callback secret. Positive and negative cases;
the one check is ``not_a_server_error``: hostile or unexpected input is a 4xx (or a
2xx ``rejected`` for an AP event), never a 5xx. The last test shows the harness does
report a 5xx.

``GET /rate`` is served (anchor/quotes.py; here on the fixed mid rate, no feed);
so are ``GET`` / ``PUT /customer`` and ``DELETE /customer/{id}`` (anchor/customers.py):
every operation of the spec is implemented (no 405).
Examples are bounded (:data:`EXAMPLES` per operation and mode) so both tests together
stay well under 90 s."""

from __future__ import annotations

import time
from collections import Counter

import httpx
import jwt
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error

from anchor import stellar
from sagas import engine, remittances
from tests.conftest import reference_path

EXAMPLES = 30
PARTNER_ACCOUNT = "GBR5EOMXSVA5S3QQGQJXQ6N6XP6CSLSZRHOCB5AG5AZ7KI2Q7X7W3MYK"


@pytest.fixture
def no_outside(monkeypatch):
    """As in tests/test_remittance_api.py: a created remittance reads the hub's Horizon
    cursor and enqueues a Celery run; neither is what this test is about."""
    monkeypatch.setattr(stellar, "latest_payment_cursor", lambda account: "12345")
    monkeypatch.setattr(engine, "_enqueue", lambda saga_id, delay: None)


def _runner(operation, mode: GenerationMode, base_url: str, headers: dict, seen: list[int]):
    # No shrinking: the failure message carries the curl command that reproduces it.
    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              phases=(Phase.explicit, Phase.generate), suppress_health_check=list(HealthCheck))
    @given(case=operation.as_strategy(mode))
    def run(case):
        response = case.call(base_url=base_url, headers=headers, timeout=10)
        assert response.status_code < 500, (case.as_curl_command(), response.status_code,
                                            response.text[:500])
        case.validate_response(response, checks=[not_a_server_error])
        seen.append(response.status_code)

    return run


def _fuzz(schema, base_url: str, headers: dict, only: str | None = None
          ) -> dict[str, list[int]]:
    """Every operation of ``schema``, positive then negative cases, each response
    checked with ``not_a_server_error``. Returns the status codes seen by operation.
    An operation with nothing to make invalid has no negative cases (Hypothesis
    reports it unsatisfiable): skipped. ``only``: one operation's label."""
    ran: dict[str, list[int]] = {}
    for result in schema.get_all_operations():
        operation = result.ok()
        if only is not None and operation.label != only:
            continue
        seen = ran.setdefault(operation.label, [])
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            try:
                _runner(operation, mode, base_url, headers, seen)()
            except Unsatisfiable:
                if mode is GenerationMode.POSITIVE:
                    raise
    return ran


@pytest.mark.django_db(transaction=True)
def test_the_partner_api_never_answers_a_server_error(live_server, no_outside):
    _, key = remittances.partner_create(name="fuzz", stellar_account=PARTNER_ACCOUNT)
    raw = httpx.get(f"{live_server.url}/api/schema/", params={"format": "json"},
                    timeout=10).json()
    schema = schemathesis.openapi.from_dict(raw)

    ran = _fuzz(schema, f"{live_server.url}", {"Authorization": f"Bearer {key}"})

    # The key was taken: the partner's requests got past authentication.
    assert any(code not in (401, 403) for code in ran["POST /api/remittances"])
    assert any(code == 404 for code in ran["GET /api/remittances/{saga_id}"])


@pytest.mark.django_db(transaction=True)
def test_the_callbacks_never_answer_a_server_error(live_server, settings):
    path = reference_path("anchor-platform", "openapi", "bundled-callbacks.yaml")
    schema = schemathesis.openapi.from_path(str(path))
    token = jwt.encode({"iat": int(time.time()), "exp": int(time.time()) + 3600},
                       settings.AP_CALLBACK_AUTH_SECRET, algorithm="HS256")

    settings.QUOTE_RATE_URL = ""  # the fixed mid: this test starts no rate feed
    ran = _fuzz(schema, f"{live_server.url}/callbacks", {"Authorization": f"Bearer {token}"})
    print("callbacks conformance:", {op: dict(sorted(Counter(codes).items()))
                                     for op, codes in ran.items()})  # pytest -s shows it

    assert 200 in ran["POST /event"]  # authenticated: handled or acknowledged as rejected
    # Random strings rarely pass the KYC formats (IFSC, PAN, dates): 400s, authenticated.
    assert 400 in ran["PUT /customer"] and 401 not in ran["PUT /customer"]
    # A GET names someone (an id, or an account that is a Stellar account): fuzzed
    # strings are 400s and unknown ids 404s, authenticated (tests/test_customers.py reads).
    assert {400, 404} >= set(ran["GET /customer"]) and 404 in ran["DELETE /customer/{id}"]
    assert 405 not in {code for codes in ran.values() for code in codes}  # all implemented


@pytest.mark.django_db(transaction=True)
def test_the_fuzzing_reports_a_server_error(live_server, settings, monkeypatch):
    # The harness itself can fail: a handler that blows up is caught at once.
    from anchor import customers

    def boom(*args, **kwargs):
        raise RuntimeError("handler failed")

    monkeypatch.setattr(customers, "put", boom)
    schema = schemathesis.openapi.from_path(
        str(reference_path("anchor-platform", "openapi", "bundled-callbacks.yaml")))

    with pytest.raises(AssertionError, match="500"):
        _fuzz(schema, f"{live_server.url}/callbacks",
              {"X-Api-Key": settings.AP_CALLBACK_AUTH_SECRET}, only="PUT /customer")
