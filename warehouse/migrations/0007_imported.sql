-- 0007: campaigns imported from another harness's results (warehouse/imports, `specgauge import seed`):
-- `imported` is true for them (campaign.json's `imported` block) and `imported_from` keeps that block
-- (source, path, importer and its version) as JSON. Campaigns run by specgauge: false and NULL.
ALTER TABLE campaigns ADD COLUMN imported BOOLEAN DEFAULT false;
ALTER TABLE campaigns ADD COLUMN imported_from JSON;
UPDATE campaigns SET imported = false WHERE imported IS NULL;
