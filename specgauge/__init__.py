"""The shared floor every package may import: settings, errors, provenance and checkpoint hashes, progress,
safe names, redaction, one-writer locks, flow path checks, kernel receive timestamps."""
