"""Progress of a campaign: a rich display of cells done, requests and ETA for CLI runs. Flows report to
whatever reporter is active; the campaign flow adds the Prefect UI's progress artifact
(flows/progress.py) to it, so a run started anywhere shows its progress in the UI."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


class Reporter:
    """The silent default."""

    def campaign(self, cells: int, deployments: int, campaign_id: str = "") -> None: ...
    def deployment(self, name: str, status: str) -> None: ...
    def cell_started(self, cell_id: str, requests: int) -> None: ...
    def request_done(self) -> None: ...
    def cell_done(self, cell_id: str, status: str) -> None: ...
    def note(self, text: str) -> None: ...


class RichReporter(Reporter):
    def __init__(self, console: Console | None = None) -> None:
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            console=console or Console(stderr=True),
            transient=False,
        )
        self.cells_task = None
        self.requests_task = None

    def campaign(self, cells: int, deployments: int, campaign_id: str = "") -> None:
        self.cells_task = self.progress.add_task(f"cells ({deployments} deployments)", total=cells)

    def deployment(self, name: str, status: str) -> None:
        self.progress.console.log(f"deployment {name}: {status}")

    def cell_started(self, cell_id: str, requests: int) -> None:
        if self.requests_task is not None:
            self.progress.remove_task(self.requests_task)
        self.requests_task = self.progress.add_task(f"  {cell_id}", total=requests)

    def request_done(self) -> None:
        if self.requests_task is not None:
            self.progress.advance(self.requests_task)

    def cell_done(self, cell_id: str, status: str) -> None:
        if self.cells_task is not None:
            self.progress.advance(self.cells_task)
        if status != "ok":
            self.progress.console.log(f"cell {cell_id}: {status}")

    def note(self, text: str) -> None:
        self.progress.console.log(text)


class Tee(Reporter):
    """Reports to several reporters at once (the CLI's display and the Prefect UI's progress artifact)."""

    def __init__(self, *reporters: Reporter) -> None:
        self.reporters = reporters

    def campaign(self, cells: int, deployments: int, campaign_id: str = "") -> None:
        for r in self.reporters:
            r.campaign(cells, deployments, campaign_id)

    def deployment(self, name: str, status: str) -> None:
        for r in self.reporters:
            r.deployment(name, status)

    def cell_started(self, cell_id: str, requests: int) -> None:
        for r in self.reporters:
            r.cell_started(cell_id, requests)

    def request_done(self) -> None:
        for r in self.reporters:
            r.request_done()

    def cell_done(self, cell_id: str, status: str) -> None:
        for r in self.reporters:
            r.cell_done(cell_id, status)

    def note(self, text: str) -> None:
        for r in self.reporters:
            r.note(text)


_current: Reporter = Reporter()


def current() -> Reporter:
    return _current


@contextmanager
def reporting(reporter: Reporter) -> Iterator[Reporter]:
    global _current
    previous, _current = _current, reporter
    progress = getattr(reporter, "progress", None)
    try:
        if progress is not None:
            with progress:
                yield reporter
        else:
            yield reporter
    finally:
        _current = previous
