"""The report server serves HOME/reports and nothing else: GET/HEAD only, no way out of the folder."""

from __future__ import annotations

import http.client
from pathlib import Path

import httpx
import pytest

from analysis.serve import report_url, serving


@pytest.fixture
def reports(tmp_path: Path) -> Path:
    root = tmp_path / "reports"
    (root / "camp-1").mkdir(parents=True)
    (root / "camp-1" / "index.html").write_text("<html>the report</html>")
    (root / "camp-1" / "speedup.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    (tmp_path / "secret.txt").write_text("not for the browser")
    (root / "camp-1" / "leak").symlink_to(tmp_path / "secret.txt")
    (root / "escape").symlink_to(tmp_path)
    return root


def raw_get(base: str, path: str) -> tuple[int, bytes]:
    """A request whose path goes out exactly as written (httpx would normalise the dots away)."""
    host, port = base.removeprefix("http://").split(":")
    con = http.client.HTTPConnection(host, int(port), timeout=10)
    con.request("GET", path)
    response = con.getresponse()
    return response.status, response.read()


def test_it_serves_the_reports(reports: Path) -> None:
    with serving(reports) as base:
        assert base.startswith("http://127.0.0.1:")
        page = httpx.get(f"{base}/camp-1/index.html")
        assert page.status_code == 200 and page.text == "<html>the report</html>"
        assert page.headers["content-type"].startswith("text/html")
        assert httpx.get(f"{base}/camp-1/speedup.png").headers["content-type"] == "image/png"
        assert "camp-1" in httpx.get(f"{base}/").text  # the folder lists its campaigns


@pytest.mark.parametrize(
    "path",
    [
        "/../secret.txt",
        "/camp-1/../../secret.txt",
        "/%2e%2e/secret.txt",
        "/camp-1/%2e%2e%2f%2e%2e%2fsecret.txt",
        "/camp-1/leak",
        "/escape/secret.txt",
        "/escape/",
    ],
)
def test_nothing_outside_the_folder(reports: Path, path: str) -> None:
    with serving(reports) as base:
        status, body = raw_get(base, path)
    assert status == 404, (path, status, body[:80])
    assert b"not for the browser" not in body


def test_read_only(reports: Path) -> None:
    with serving(reports) as base:
        for method in ("POST", "PUT", "DELETE"):
            assert httpx.request(method, f"{base}/camp-1/index.html", content=b"x").status_code == 501
    assert (reports / "camp-1" / "index.html").read_text() == "<html>the report</html>"


def test_bound_to_the_address_given(reports: Path) -> None:
    with serving(reports, host="127.0.0.2") as base:
        assert base.startswith("http://127.0.0.2:")
        port = int(base.rsplit(":", 1)[1])
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"http://127.0.0.1:{port}/camp-1/index.html")
        assert httpx.get(f"{base}/camp-1/index.html").status_code == 200


def test_links_go_through_the_server_only_when_it_is_configured(reports: Path) -> None:
    page = reports / "camp-1" / "index.html"
    assert report_url(page, reports, served_at="") == page.resolve().as_uri()
    assert report_url(page, reports, served_at="http://h:4280/") == "http://h:4280/camp-1/index.html"
    outside = reports.parent / "secret.txt"  # not under the folder: no server link for it
    assert report_url(outside, reports, served_at="http://h:4280") == outside.resolve().as_uri()
