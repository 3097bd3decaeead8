"""``/metrics`` behind its bearer token, and added up over every gunicorn worker
(gunicorn.conf.py prepares ``PROMETHEUS_MULTIPROC_DIR``; issue 9, part 7)."""

from __future__ import annotations

import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.flows import METRICS_TOKEN, Gunicorn

# --- the token ---------------------------------------------------------------------

@pytest.mark.django_db
@pytest.mark.parametrize("header", [None, "Bearer wrong-token", f"Basic {METRICS_TOKEN}",
                                    f"Bearer {METRICS_TOKEN}x", "Bearer"])
def test_metrics_refuse_a_missing_or_wrong_bearer_token(client, settings, header):
    settings.METRICS_TOKEN = METRICS_TOKEN
    extra = {"HTTP_AUTHORIZATION": header} if header else {}

    response = client.get("/metrics", **extra)

    assert response.status_code == 401
    assert response["WWW-Authenticate"] == 'Bearer realm="metrics"'
    assert b"corridor_" not in response.content


@pytest.mark.django_db
def test_metrics_answer_the_right_bearer_token(client, settings):
    settings.METRICS_TOKEN = METRICS_TOKEN

    response = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {METRICS_TOKEN}")

    assert response.status_code == 200
    assert b"corridor_deposit_releases" in response.content


@pytest.mark.django_db
def test_metrics_without_a_token_are_open_in_development_and_refused_in_production(
        client, settings):
    settings.METRICS_TOKEN = ""
    open_in_dev = client.get("/metrics")
    settings.CORRIDOR_ENV = "production"

    refused = client.get("/metrics")

    assert open_in_dev.status_code == 200
    assert refused.status_code == 403
    assert b"corridor_" not in refused.content


# --- several workers, one answer -------------------------------------------------------


def _health_requests(text: str) -> float:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "django_http_requests_total_by_view_transport_method_total" \
                    and sample.labels.get("view") == "health":
                return sample.value
    return 0.0


@pytest.mark.slow
@pytest.mark.django_db
def test_metrics_add_up_every_gunicorn_worker_dead_or_alive(tmp_path):
    # given: a stale file from an earlier run, two workers each recycled every 6 requests
    metrics_dir = tmp_path / "prometheus"
    metrics_dir.mkdir()
    (metrics_dir / "counter_999999.db").write_bytes(b"stale")
    server = Gunicorn("multiproc", "--workers", "2", "--threads", "1", "--max-requests", "6",
                      PROMETHEUS_MULTIPROC_DIR=str(metrics_dir), METRICS_TOKEN=METRICS_TOKEN)
    try:
        before = _health_requests(_scrape(server))
        n = 20
        with ThreadPoolExecutor(max_workers=2) as pool:
            statuses = list(pool.map(lambda _: httpx.get(f"{server.url}/health/",
                                                         timeout=60).status_code, range(n)))
        # when: several scrapes, served by whichever worker is up
        totals = [_health_requests(_scrape(server)) for _ in range(5)]
    finally:
        server.stop()

    assert before == 0
    assert statuses == [200] * n
    assert totals == [n] * 5
    assert not (metrics_dir / "counter_999999.db").exists()
    pids = {path.stem.rsplit("_", 1)[1] for path in metrics_dir.glob("counter_*.db")}
    assert len(pids) >= 3, pids  # 2 workers, recycled at least once


def _scrape(server: Gunicorn) -> str:
    response = httpx.get(f"{server.url}/metrics", timeout=60,
                         headers={"Authorization": f"Bearer {METRICS_TOKEN}"})
    assert response.status_code == 200, response.text
    return response.text


@pytest.mark.slow
@pytest.mark.django_db
def test_gunicorn_makes_and_removes_its_own_metrics_dir_when_none_is_given():
    tmp = Path(tempfile.gettempdir())
    existing = set(tmp.glob("corridor-prometheus-*"))
    server = Gunicorn("own-dir", "--workers", "1")
    try:
        httpx.get(f"{server.url}/health/", timeout=10)
        made = set(tmp.glob("corridor-prometheus-*")) - existing
        files = [p.name for d in made for p in d.glob("counter_*.db")]
    finally:
        server.stop()

    assert len(made) == 1, made
    assert files, made
    assert not next(iter(made)).exists()
