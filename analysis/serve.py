"""The report server: HOME/reports over HTTP, so that a person in the Prefect UI opens a campaign's report
with one click from its run's artifacts (a file:// link on the worker's disk opens nothing elsewhere).

It serves the reports folder and nothing else: GET and HEAD only, no path outside the folder (`..` is
dropped by the standard handler, a symlink that leads out is refused here), bound to the address the user
chose (127.0.0.1 unless told otherwise). The pages are self-contained (no CDN), so the server is all a
browser needs."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import quote

from specgauge.settings import get_settings

log = logging.getLogger("specgauge.reports")

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 4280


class ReportHandler(SimpleHTTPRequestHandler):
    """The standard library's static file handler, kept inside its folder and quiet on stderr."""

    server_version = "specgauge-reports"

    def send_head(self):  # GET and HEAD both start here
        root = Path(self.directory).resolve()
        resolved = Path(self.translate_path(self.path)).resolve()  # `..` segments already dropped
        if resolved != root and root not in resolved.parents:  # a symlink that leads out of the folder
            self.send_error(404, "File not found")
            return None
        return super().send_head()

    def log_message(self, format: str, *args: object) -> None:
        log.debug("%s %s", self.address_string(), format % args)


def report_server(
    root: Path | None = None, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT
) -> ThreadingHTTPServer:
    """A server (not yet serving) for `root` (default HOME/reports), bound to host:port (port 0: any free)."""
    folder = Path(root or get_settings().reports_dir)
    folder.mkdir(parents=True, exist_ok=True)
    return ThreadingHTTPServer((host, port), partial(ReportHandler, directory=str(folder.resolve())))


@contextmanager
def serving(root: Path | None = None, host: str = DEFAULT_HOST, port: int = 0) -> Iterator[str]:
    """Serve `root` in a background thread for the duration; yields the base URL."""
    server = report_server(root, host, port)
    thread = threading.Thread(target=server.serve_forever, name="report-server", daemon=True)
    thread.start()
    try:
        yield base_url(server)
    finally:
        server.shutdown()
        server.server_close()


def base_url(server: ThreadingHTTPServer) -> str:
    host, port = server.server_address[:2]
    return f"http://{host}:{port}"


def report_url(report: Path | str, reports_dir: Path | None = None, served_at: str | None = None) -> str:
    """Where a browser opens `report` (a file under the reports folder): through the report server when
    SPECGAUGE_REPORTS_URL says where it runs, else as a file:// URI (which opens on the worker's machine)."""
    served_at = served_at if served_at is not None else get_settings().reports_url
    path = Path(report).resolve()
    root = Path(reports_dir or get_settings().reports_dir).resolve()
    if not served_at or root not in path.parents:
        return path.as_uri()
    return served_at.rstrip("/") + "/" + quote(path.relative_to(root).as_posix())
