import pytest


@pytest.mark.django_db
def test_health_reports_each_dependency(client):
    response = client.get("/health/")

    body = response.json()
    assert set(body["checks"]) == {"database", "broker", "horizon", "anchor_platform"}
    assert body["checks"]["database"] == "ok"
    assert body["checks"]["broker"] == "ok"


@pytest.mark.django_db(transaction=True)
def test_health_is_ok_with_the_sandbox_up(client, sandbox):
    response = client.get("/health/")

    assert response.status_code == 200, response.json()
    assert response.json()["status"] == "ok"


@pytest.mark.django_db
def test_health_is_degraded_when_horizon_is_unreachable(client, settings):
    settings.HORIZON_URL = "http://127.0.0.1:9/horizon"

    response = client.get("/health/")

    assert response.status_code == 503
    assert response.json()["checks"]["horizon"].startswith("down:")
