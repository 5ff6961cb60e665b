"""Shared fixtures (tests/README.md). The embedded engine is expensive to start (one to two minutes on 2
cores), so the session starts as few as it can: one campaign (`demo_campaign`, on the tests' own spec) whose
results several files read, and one engine per variant (`engines`) for every test that only needs one
running; the campaign's tests run first, while no pool engine is up, and tests that stop the pool last.

`make test` runs two pytest-xdist workers (`-n 2 --dist loadgroup`): one takes the group "serial" (every
test on the machine's one engine slot, the SLURM node or the sshd, and the `timing` tests), in the order
below; the other runs everything else meanwhile. Plain `pytest` runs the same order in one process."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

# The emulator (a child process per session, reset for each test): fixtures `emulator`, `emulator_session`.
from emulator_fixture import emulator, emulator_session  # noqa: F401
from prefect.logging.configuration import setup_logging

import flows  # noqa: F401  (Prefect's settings and logging file first: flows/__init__.py)

# Prefect's logging set up now, on the session's stderr: set up lazily inside a CLI test (typer's CliRunner
# swaps stderr), its console handler would keep that test's stream, closed afterwards, and every later flow's
# log line in this process would fail with "I/O operation on closed file".
setup_logging()

# Helper modules are not test modules: ask pytest to rewrite their asserts too (before test modules import them).
pytest.register_assert_rewrite("reliability_support", "warehouse_fixtures", "analysis_fixtures")

REPO = Path(__file__).resolve().parent.parent
ENGINE_LOCK = Path(os.environ.get("SPECGAUGE_ENGINE_LOCK", "/tmp/specgauge-engine.lock"))
# The tests' campaign: the demo cut to what the engine tests assert on (the file says why each part is there).
CAMPAIGN_SPEC = REPO / "tests" / "data" / "specs" / "campaign.yaml"


# A pool engine starts inside the body of the first test that asks for it (ready timeout 600 s).
POOL_TEST_TIMEOUT_S = 900


# Fixtures on the machine's one engine slot (the engine lock is held by one session, or worker, at a time).
ENGINE_SLOT_FIXTURES = {"engine_lock", "engines"}
ENGINE_FIXTURES = ENGINE_SLOT_FIXTURES | {"demo_campaign"}


def runs_serially(item: pytest.Item) -> bool:
    """On the serial worker: what needs the engine slot, the SLURM node or the sshd (one of each on this
    machine), and the `timing` tests (millisecond assertions that want the cores to themselves)."""
    names = set(getattr(item, "fixturenames", ()))
    markers = ("engine", "slurm", "timing", "quiet")
    return bool(names & ENGINE_SLOT_FIXTURES) or any(item.get_closest_marker(m) for m in markers)


# tryfirst: pytest-xdist's worker reads the xdist_group marks in its own hook, registered after this file.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Engine starts are the suite's cost, so order by what a test needs: first the tests that read the
    session's campaign (it runs with no pool engine up), then the rest in file order (the pool starts each
    variant at its first use and keeps it), then the tests that stop the pool to start engines of their own,
    then the `timing` tests without an engine (by then the other worker has long finished: its share took
    about a third as long as the serial one's), last the `quiet` tests, whose verdicts rest on measured speed. Tests of the pool get the time an engine start may take,
    unless they set their own timeout."""

    def rank(item: pytest.Item) -> int:
        names = getattr(item, "fixturenames", ())
        if item.get_closest_marker("quiet"):
            # a verdict from measured speed: other processes beside the engine change it (docs/analysis.md,
            # "Contention"; CI's twin sweep measured EAGLE-3 at C=1 at 0.62x plain with others at 34% of the
            # CPU, 1.5x quiet), so last, when the other worker is done
            return 4
        if "demo_campaign" in names:
            return 0
        if "no_idle_engines" in names:
            return 2
        if item.get_closest_marker("timing") and "engines" not in names:
            return 3
        return 1

    items.sort(key=rank)  # stable: file order within each rank
    for item in items:
        # what starts or reads an engine is an `engine` test, marked or not: `-m "not engine"` keeps it out
        if ENGINE_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.engine)
        if "engines" in getattr(item, "fixturenames", ()) and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(POOL_TEST_TIMEOUT_S))
        if runs_serially(item):
            item.add_marker(pytest.mark.xdist_group("serial"))


# The serial worker is the run's critical path; the other worker only fills the cores it leaves idle. Measured
# 2026-12-01 on 2 cores: at equal priority the other worker's CPU work slowed the session's campaign from 14 to
# 19 minutes.
BACKGROUND_NICE = 10


@pytest.fixture(autouse=True)
def critical_path_first(request: pytest.FixtureRequest) -> None:
    """Under pytest-xdist, a worker that runs a test outside the serial group lowers its own priority (and its
    children's) for the rest of the run; the serial worker runs its whole group first, at normal priority."""
    background = os.environ.get("PYTEST_XDIST_WORKER") and not runs_serially(request.node)
    if background and os.getpriority(os.PRIO_PROCESS, 0) < BACKGROUND_NICE:
        os.setpriority(os.PRIO_PROCESS, 0, BACKGROUND_NICE)


# A `quiet` test's verdict rests on measured speed, and the validity check calls a cell contended when other
# processes took more than 10% of the host's CPU (validity.max_other_cpu_share). Running last in the serial
# group is not enough: the other worker may still be busy (CI of 2026-12-05: its share ran past the serial one
# and the twin sweep was judged invalid, 28% taken by others). Waiting for a quiet moment is not enough either
# (CI of 2026-12-05 06:33: quiet at the start, 9%, then the other worker's next tests ran beside the sweep, whose
# EAGLE-3 cell at C=1 measured 0.94x plain, and 23% of the suite finished after it). So a quiet test holds the
# host: it closes a gate that every other worker's test passes before it starts, waits for the test running
# there to end, and then for the host's CPU to settle (measured the way the cells measure it,
# tasks/metrics/host_load.py). The other worker's remaining tests run after it.
QUIET_MAX_OTHER_SHARE = 0.10
QUIET_WINDOW_S = 2.0
QUIET_WINDOWS = 3  # consecutive quiet windows
QUIET_WAIT_S = 1200.0


def wait_until_quiet() -> tuple[float, float | None]:
    """Wait until other processes took at most QUIET_MAX_OTHER_SHARE of the CPU over QUIET_WINDOWS windows in
    a row (or QUIET_WAIT_S passed); the seconds waited and the last window's other share."""
    import time

    from tasks.metrics import host_load

    started, quiet, last = time.monotonic(), 0, None
    while quiet < QUIET_WINDOWS and time.monotonic() - started < QUIET_WAIT_S:
        before = host_load.snapshot()
        time.sleep(QUIET_WINDOW_S)
        window = host_load.shares(before, host_load.snapshot())
        if window is None:  # not Linux: nothing to measure
            break
        last = window.other
        quiet = quiet + 1 if window.other <= QUIET_MAX_OTHER_SHARE else 0
    return time.monotonic() - started, last


@pytest.fixture(scope="session")
def host_locks(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The gate and the busy lock, in the folder every xdist worker of this run shares (the parent of each
    worker's basetemp), so that they bind the workers of one run and nothing else."""
    shared = tmp_path_factory.getbasetemp().parent
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        shared = tmp_path_factory.getbasetemp()  # one process: nothing runs beside it
    return shared / "quiet-gate.lock", shared / "quiet-busy.lock"


@pytest.fixture(autouse=True)
def quiet_host(request: pytest.FixtureRequest, host_locks: tuple[Path, Path]) -> Iterator[None]:
    """A `quiet` test holds the host (gate and busy lock exclusive); any other test outside the serial group
    passes the gate (shared, at once released: it only waits while a quiet test holds it) and holds the busy
    lock shared while it runs. Tests of the serial group run on the quiet test's own worker, one at a time."""
    gate_path, busy_path = host_locks
    quiet = request.node.get_closest_marker("quiet") is not None
    if not quiet and runs_serially(request.node):
        yield
        return
    with open(gate_path, "a") as gate, open(busy_path, "a") as busy:
        if quiet:
            fcntl.flock(gate, fcntl.LOCK_EX)  # no other test starts from now on
            fcntl.flock(busy, fcntl.LOCK_EX)  # the one running there has ended
            waited, other = wait_until_quiet()
            shown = "unknown" if other is None else f"{other:.0%}"
            print(
                f"quiet: holds the host; waited {waited:.0f} s for its CPU to settle (others' share: {shown})"
            )
        else:
            fcntl.flock(gate, fcntl.LOCK_SH)
            fcntl.flock(gate, fcntl.LOCK_UN)
            fcntl.flock(busy, fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(busy, fcntl.LOCK_UN)
            fcntl.flock(gate, fcntl.LOCK_UN)


@pytest.fixture(scope="session", autouse=True)
def isolated_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Every test session writes raw artifacts, ledger and warehouse under its own SPECGAUGE_HOME."""
    home = tmp_path_factory.mktemp("specgauge-home")
    previous = os.environ.get("SPECGAUGE_HOME")
    os.environ["SPECGAUGE_HOME"] = str(home)
    from specgauge.settings import get_settings

    get_settings.cache_clear()
    yield home
    if previous is None:
        os.environ.pop("SPECGAUGE_HOME", None)
    else:
        os.environ["SPECGAUGE_HOME"] = previous
    get_settings.cache_clear()


@pytest.fixture(autouse=True)
def settings_follow_the_environment() -> Iterator[None]:
    """Settings are cached; a test that monkeypatched SPECGAUGE_HOME must not leave its home cached for the
    next test (which would then read another ledger, and reap or miss the wrong engines)."""
    yield
    from specgauge.settings import get_settings

    get_settings.cache_clear()  # runs after monkeypatch has restored the environment


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """This test's own SPECGAUGE_HOME: its raw tree, ledger and warehouse, apart from every other test's."""
    from specgauge.settings import get_settings

    path = tmp_path / "home"
    monkeypatch.setenv("SPECGAUGE_HOME", str(path))
    get_settings.cache_clear()
    yield path


@pytest.fixture(scope="session")
def engine_lock() -> Iterator[None]:
    """Serialise engine use across concurrent test sessions on one machine (2 cores fit one engine)."""
    ENGINE_LOCK.parent.mkdir(parents=True, exist_ok=True)
    with open(ENGINE_LOCK, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


@pytest.fixture(scope="session")
def campaign_spec() -> Path:
    """The spec of the session's campaign (`demo_campaign`) and of the pool's engines."""
    return CAMPAIGN_SPEC


class EnginePool:
    """Starts each variant's engine (of the tests' campaign spec) on first use and keeps it for the session.
    Idle engines cost little CPU, so keeping every variant's engine up saves a start per test that needs it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.running: dict[str, tuple[object, object]] = {}  # variant name -> (launcher, deployment)

    def get(self, variant_name: str):
        from experiments.spec import load_spec
        from tasks.health import wait_ready
        from tasks.launch.local import LocalLauncher

        if variant_name in self.running:
            return self.running[variant_name][1]
        spec = load_spec(CAMPAIGN_SPEC)
        variant = next(v for v in spec.variants if v.name == variant_name)
        launcher = LocalLauncher(spec.launcher)
        deployment = launcher.launch(
            spec.target, variant, deployment_id=f"test.{variant_name}", directory=self.root / variant_name
        )
        self.running[variant_name] = (launcher, deployment)
        wait_ready(deployment, launcher, timeout_s=600)
        launcher.collect_facts(deployment)
        return deployment

    def launcher(self, variant_name: str):
        return self.running[variant_name][0]

    def stop(self) -> None:
        while self.running:
            _, (launcher, deployment) = self.running.popitem()
            launcher.teardown(deployment)


@pytest.fixture(scope="session")
def engines(engine_lock: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EnginePool]:
    pool = EnginePool(tmp_path_factory.mktemp("engines"))
    try:
        yield pool
    finally:
        pool.stop()


@pytest.fixture
def no_idle_engines(engines: EnginePool) -> EnginePool:
    """For a test that starts engines of its own on this machine: the pool's idle engines stopped first (the
    session holds the engine lock). These tests run after every test that uses the pool, so that nothing
    starts a pool engine twice (pytest_collection_modifyitems)."""
    engines.stop()
    return engines


@pytest.fixture(scope="session")
def prefect_harness(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """One Prefect test server for the session's flow runs, tuned as the measured facts say: no heartbeat
    wait at flow exit, and no SQLite services that answer 503 under back-to-back runs."""
    os.environ["PREFECT_HOME"] = str(tmp_path_factory.mktemp("prefect-home"))
    os.environ["PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_ENABLED"] = "false"
    os.environ["PREFECT_SERVER_SERVICES_EVENT_PERSISTER_ENABLED"] = "false"
    from specgauge.prefect_env import configure

    configure()
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings
    from prefect.testing.utilities import prefect_test_harness

    # Prefect waits 30 s for its test server by default; on 2 busy cores it took longer (the whole session's
    # flow tests then error at set-up).
    with (
        prefect_test_harness(server_startup_timeout=120),
        temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}),
    ):
        yield


@pytest.fixture(scope="session")
def demo_campaign(prefect_harness: None, engines: EnginePool) -> dict:
    """The demo's variants in the tests' campaign (tests/data/specs/campaign.yaml: 5 engine starts and a
    profiled one), run once per session through the campaign flow on the real engine; the tests of the flow,
    the warehouse, the gate, the captures, the profile and the analysis read its results."""
    engines.stop()  # none is up when the campaign's tests run first; idle engines would compete for the cores
    from flows.campaign import CampaignRequest, campaign

    return campaign(CampaignRequest(spec_path=str(CAMPAIGN_SPEC)))
