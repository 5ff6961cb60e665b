"""The emulator for tests: one child process per test session, reset to its defaults before each test.

`emulator` (function scope) gives a running emulator (`.url`, `.configure(**fields)`, `.stats()`,
`.metrics()`, `.restart()`, `.trace()`) with default config, zeroed counters and stats. It runs in its own
process so that its work never competes with the client under test for the GIL.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest

from emulator import EmulatorConfig, EmulatorProcess

MODEL = "emulated"


def _defaults() -> dict:
    config = dataclasses.asdict(EmulatorConfig(model=MODEL, trace=True))
    for name in ("host", "port"):
        config.pop(name)
    return config


@pytest.fixture(scope="session")
def emulator_session() -> Iterator[EmulatorProcess]:
    with EmulatorProcess(EmulatorConfig(port=0, model=MODEL, trace=True)) as emu:
        yield emu


@pytest.fixture
def emulator(emulator_session: EmulatorProcess) -> EmulatorProcess:
    emu = emulator_session
    if emu.proc is None or emu.proc.poll() is not None:
        emu.start()
    emu.configure(**_defaults())
    emu.restart()
    emu.reset_stats()
    emu.trace()
    return emu
