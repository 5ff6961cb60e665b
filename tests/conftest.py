"""Shared fixtures. The embedded engine is expensive to start (about a minute on 2 cores), so each
variant's engine is started at most once per test session and shared by every test that needs it."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

# The emulator (a child process per session, reset for each test): fixtures `emulator`, `emulator_session`.
from emulator_fixture import emulator, emulator_session  # noqa: F401

REPO = Path(__file__).resolve().parent.parent
ENGINE_LOCK = Path(os.environ.get("SPECGAUGE_ENGINE_LOCK", "/tmp/specgauge-engine.lock"))


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


class EnginePool:
    """Starts each variant's engine on first use and keeps it for the session. Idle engines cost little
    CPU, so keeping plain, n-gram and draft-model engines up saves a minute per restart."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.running: dict[str, tuple[object, object]] = {}  # variant name -> (launcher, deployment)

    def get(self, variant_name: str):
        from experiments.spec import load_spec
        from tasks.health import wait_ready
        from tasks.launch.local import LocalLauncher

        if variant_name in self.running:
            return self.running[variant_name][1]
        spec = load_spec(REPO / "experiments" / "demo.yaml")
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

    with prefect_test_harness(), temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
        yield


@pytest.fixture(scope="session")
def demo_campaign(prefect_harness: None, engines: EnginePool) -> dict:
    """The demo campaign, run once per session through the campaign flow on the real engine (about ten
    minutes); the tests of the flow, the warehouse, the gate and the analysis all read its results."""
    engines.stop()  # idle engines would only compete for the two cores
    from flows.campaign import campaign

    return campaign(spec="experiments/demo.yaml")
