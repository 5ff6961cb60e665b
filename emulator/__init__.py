"""An OpenAI-compatible streaming server that behaves like vLLM, for fault injection and client load tests.

It never stands in for the real engine where a test claims a feature works; it is how tests make the
client see every failure it must classify, and how benchmarks/client_accuracy.py knows the truth (the
injected TTFT and step time) that the client's measurements are compared with.
"""

from emulator.config import FAULTS, EmulatorConfig
from emulator.launch import EmulatorProcess, EmulatorThread
from emulator.server import Emulator

__all__ = ["FAULTS", "Emulator", "EmulatorConfig", "EmulatorProcess", "EmulatorThread"]
