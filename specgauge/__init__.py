"""specgauge."""
