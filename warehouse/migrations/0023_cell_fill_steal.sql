-- 0023: the load each cell actually reached and the CPU the hypervisor stole during it (summary.json
-- `achieved_concurrency` and `host.steal_share`; artifacts.documents.CellSummary, tasks/metrics/host_load.py).
-- `achieved_concurrency`: the time-weighted mean number of measured requests in flight over the cell's wall_s
-- window (analysis/validity.py compares it with a closed-loop cell's C). `host_steal_share`: the share of the
-- host's CPU capacity the hypervisor gave to other tenants while the cell measured; `host_other_share` now
-- excludes it. NULL: a cell measured before these were recorded (its steal, if any, is in host_other_share).
ALTER TABLE cells ADD COLUMN achieved_concurrency DOUBLE;
ALTER TABLE cells ADD COLUMN host_steal_share DOUBLE;
