"""Importers: other harnesses' results translated into our raw artifacts (artifacts.layout), then loaded by
the normal ingest (flows.import_reference), so imported and measured campaigns answer the same SQL.

An importer never writes warehouse tables itself: it writes a campaign of raw documents, marked as imported
(artifacts.documents.CampaignRecord.imported), and the ingest validates and loads it like any other.
"""
