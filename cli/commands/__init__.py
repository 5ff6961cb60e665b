"""CLI command groups, one module per area; each exposes register(app) (warehouse_options: what the
warehouse-opening groups share)."""
