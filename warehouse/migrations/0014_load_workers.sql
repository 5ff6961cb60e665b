-- 0014: how many client processes generated a cell's load (meta.json's `load.workers`, tasks/load/workers.py).
-- NULL: a cell written before it was recorded, whose load came from one process.
ALTER TABLE cells ADD COLUMN load_workers INTEGER;
