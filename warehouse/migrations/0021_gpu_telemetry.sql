-- 0021: GPU telemetry of each cell attempt's measured window (cells/<cell>.a<n>/gpu_telemetry.json, written by
-- tasks/metrics/gpu_telemetry.py; docs/telemetry.md). One row per attempt in gpu_telemetry_cells, saying whether
-- there was telemetry and, if not, why (state 'absent', never zeros); one row per attempt and GPU in
-- gpu_telemetry. v_gpu_telemetry joins them to v_cells, with energy per output token.

CREATE TABLE gpu_telemetry_cells (
    cell_key          VARCHAR PRIMARY KEY,   -- <campaign_id>/<cell_id>.a<n>, as in cells
    campaign_id       VARCHAR NOT NULL,
    cell_id           VARCHAR NOT NULL,
    attempt           INTEGER NOT NULL,
    state             VARCHAR NOT NULL,      -- ok | absent | failed
    telemetry_status  VARCHAR NOT NULL,      -- 'ok', or 'absent: <why>' / 'failed: <why>'
    source            VARCHAR,               -- nvml | nvidia-smi; NULL when absent
    interval_s        DOUBLE NOT NULL,       -- the sampling interval asked for
    window_s          DOUBLE,                -- the measured window the figures cover
    gpus              INTEGER NOT NULL,
    energy_j          DOUBLE,                -- summed over the GPUs; NULL: no GPU reported power
    samples_file      VARCHAR,               -- gpu_samples.parquet beside it, when there were samples
    read_failures     INTEGER NOT NULL,
    source_path       VARCHAR NOT NULL,
    sha256            VARCHAR NOT NULL
);

CREATE TABLE gpu_telemetry (
    cell_key              VARCHAR NOT NULL,
    gpu_index             INTEGER NOT NULL,
    gpu_name              VARCHAR,
    samples               INTEGER NOT NULL,
    energy_j              DOUBLE,            -- power integrated over the window (edges held); NULL: no power
    energy_counter_j      DOUBLE,            -- NVML's energy counter, last - first sample; NULL: none
    mean_power_w          DOUBLE,
    max_power_w           DOUBLE,
    peak_memory_mib       DOUBLE,
    mean_memory_mib       DOUBLE,
    mean_utilization_pct  DOUBLE,
    mean_sm_clock_mhz     DOUBLE,
    first_sample_s        DOUBLE,            -- seconds after the window opened
    last_sample_s         DOUBLE,
    PRIMARY KEY (cell_key, gpu_index)
);
