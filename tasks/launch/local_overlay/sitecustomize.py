"""Mounts a `specgauge patches overlay` directory into the embedded engine's Python, as a container mount does
on a cluster: the local launcher puts this folder on the engine's PYTHONPATH and names the overlay in
SPECGAUGE_OVERLAY; Python imports `sitecustomize` at start-up in every process of the engine (spawned ones
too, since they inherit the environment), and from then on `vllm.<module>` loads from the overlay's copy of
each file it lists (overlay.json). The installed vLLM is never touched.

Runs inside the engine's own Python (the engine venv), so it imports nothing of specgauge."""

import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
from pathlib import Path


class _OverlayFinder(importlib.abc.MetaPathFinder):
    def __init__(self, root: Path, relpaths: list[str]) -> None:
        self.files: dict[str, Path] = {}
        for relpath in relpaths:
            parts = relpath.removesuffix(".py").split("/")
            if parts[-1] == "__init__":
                parts = parts[:-1]
            self.files[".".join(["vllm", *parts])] = root / relpath

    def find_spec(self, fullname: str, path=None, target=None):  # importlib's MetaPathFinder protocol
        copy = self.files.get(fullname)
        if copy is None:
            return None
        original = importlib.machinery.PathFinder.find_spec(fullname, path)
        locations = original.submodule_search_locations if original is not None else None
        return importlib.util.spec_from_file_location(fullname, copy, submodule_search_locations=locations)


def _install() -> None:
    root = os.environ.get("SPECGAUGE_OVERLAY")
    if not root:
        return
    manifest = json.loads((Path(root) / "overlay.json").read_text())
    import sys

    sys.meta_path.insert(0, _OverlayFinder(Path(root), [f["relpath"] for f in manifest["files"]]))


_install()
