"""The DuckDB warehouse: numbered migrations (migrations/), pandera models (models.py), raw artifacts into
frames (raw.py), ingest with quarantine (ingest.py), connections, writer and readers (db.py, lock.py).
See docs/warehouse.md."""
