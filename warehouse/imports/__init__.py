"""Importers: other harnesses' results translated into our raw artifacts (artifacts.layout), then loaded by
the normal ingest (warehouse.ingest), so imported and measured campaigns answer the same SQL.

An importer never writes warehouse tables itself: it writes a campaign of raw documents, marked as imported
(artifacts.documents.CampaignRecord.imported), and the ingest validates and loads it like any other.
"""

from __future__ import annotations

from warehouse.imports.seed import SeedImport, Skipped, import_seed

__all__ = ["SeedImport", "Skipped", "import_seed"]
