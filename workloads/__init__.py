"""The corpora a campaign sends (JSONL: id, workload, messages, max_tokens) and their validator (schema.py)."""
