"""`python -m emulator --port P [options]`: run the emulator until SIGINT/SIGTERM (`--help` lists options)."""

from __future__ import annotations

from emulator.launch import main

if __name__ == "__main__":
    main()
