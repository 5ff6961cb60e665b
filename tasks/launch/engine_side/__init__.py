"""What runs inside the engine's worker process (`specgauge_swap.py`: the hot-swap worker extension) and
how launchers name it. That module imports only torch, safetensors and vllm; launchers put this directory
on the engine's PYTHONPATH (local) or ship the file beside the job (clusters)."""

from pathlib import Path

ENGINE_SIDE_DIR = Path(__file__).resolve().parent
EXTENSION_FILE = ENGINE_SIDE_DIR / "specgauge_swap.py"
EXTENSION_CLASS = "specgauge_swap.SpecgaugeSwapExtension"  # --worker-extension-cls
SWAP_METHOD = "specgauge_swap_head"  # the extension's methods, called through /collective_rpc
VERIFY_METHOD = "specgauge_verify_head"
