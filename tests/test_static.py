"""Static files are served by Corridor itself in every mode (issue 9, part 6): WhiteNoise
from the finders in development and tests (no collectstatic needed, DEBUG on or off),
and hashed, compressed files from ``collectstatic`` in production."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT


@pytest.mark.parametrize("path, content_type, marker", [
    ("/static/sep24/sep24.css", "text/css", b"--brand:"),
    ("/static/sep24/sep24.js", "text/javascript", b"sep24js"),
    ("/static/sep24/favicon.svg", "image/svg+xml", b"<svg"),
    ("/static/admin/css/base.css", "text/css", b"--body-bg"),
    ("/static/corridor/admin.css", "text/css", b"overflow-wrap: anywhere"),
    ("/static/admin/js/core.js", "text/javascript", b"function"),
])
def test_sep24_and_admin_static_files_are_served_with_debug_off(client, settings, path,
                                                                 content_type, marker):
    assert settings.DEBUG is False

    response = client.get(path)

    assert response.status_code == 200
    assert response["Content-Type"].startswith(content_type)
    assert marker in b"".join(response.streaming_content)


def test_a_missing_static_file_is_a_404(client):
    assert client.get("/static/sep24/nothing-here.css").status_code == 404


def test_production_collects_hashed_compressed_files(tmp_path):
    env = {**os.environ, "CORRIDOR_ENV": "production", "STATIC_ROOT": str(tmp_path)}

    result = subprocess.run([sys.executable, "manage.py", "collectstatic", "--noinput"],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)

    assert result.returncode == 0, result.stderr[-2000:]
    manifest = json.loads((tmp_path / "staticfiles.json").read_text())["paths"]
    for name in ("sep24/sep24.css", "sep24/sep24.js", "admin/css/base.css",
                 "corridor/admin.css"):
        hashed = manifest[name]
        assert hashed != name and hashed.rsplit(".", 2)[-2].isalnum()  # name.<hash>.ext
        assert (tmp_path / hashed).is_file()
        assert (tmp_path / f"{hashed}.gz").is_file()


def test_the_release_step_collects_static_files():
    release = next(line for line in (ROOT / "Procfile").read_text().splitlines()
                   if line.startswith("release:"))

    assert "python manage.py collectstatic --noinput" in release
