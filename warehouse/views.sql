-- The warehouse's views, as they are now: (re)created after the migrations whenever this file changes
-- (warehouse.db.apply_views; its checksum is kept in schema_views). Tables change only through migrations
-- (append-only); views are derived, so they are simply replaced. A new column shows in a view by one line here.
-- Views that others read come after them (v_cells before v_speedup).

-- One row per cell: its latest attempt whose status is ok, with its speculation figures.
CREATE OR REPLACE VIEW v_cells AS
WITH attempts AS (
    SELECT campaign_id, cell_id, count(*) AS attempts FROM cells GROUP BY campaign_id, cell_id
), latest_ok AS (
    SELECT * FROM cells WHERE status = 'ok'
    QUALIFY row_number() OVER (PARTITION BY campaign_id, cell_id ORDER BY attempt DESC) = 1
)
SELECT
    c.campaign_id, c.cell_id, c.attempt, a.attempts, c.cell_key, c.deployment_id,
    c.variant, c.method, c.k, c.repeat, c.workload, c.workload_file, c.workload_sha256,
    c.load_label, c.load_mode, c.concurrency, c.rate, c.arrival, c.requests_planned, c.warmup, c.endpoint,
    c.load_workers, c.sampling, c.sampling_key, c.temperature, c.max_tokens,
    c.engine_settings, c.engine_key, c.engine_version, c.kv_cache_tokens, c.launcher, c.drafter_sha256,
    c.started_utc, c.ended_utc, c.capped,
    c.requests_total, c.requests_ok, c.requests_failed, c.success_rate,
    c.wall_s, c.output_throughput_tok_s, c.request_throughput_rps, c.completion_tokens, c.prompt_tokens,
    -- the load it reached: measured requests in flight, time-weighted over wall_s (NULL: measured before 0023)
    c.achieved_concurrency,
    c.ttft_mean_s, c.ttft_p50_s, c.ttft_p90_s, c.ttft_p95_s, c.ttft_p99_s,
    c.tpot_mean_s, c.tpot_p50_s, c.tpot_p90_s, c.tpot_p95_s, c.tpot_p99_s,
    c.e2e_mean_s, c.e2e_p50_s, c.e2e_p90_s, c.e2e_p95_s, c.e2e_p99_s,
    c.chunk_gap_mean_s, c.chunk_gap_p50_s, c.chunk_gap_p90_s, c.chunk_gap_p95_s, c.chunk_gap_p99_s,
    c.itl_per_token_mean_s, c.itl_per_token_p50_s, c.itl_per_token_p90_s, c.itl_per_token_p95_s,
    c.itl_per_token_p99_s,
    c.tokens_per_chunk_mean, c.tokens_exact,
    c.goodput_ttft_slo_s, c.goodput_tpot_slo_s, c.goodput_share, c.goodput_rate_rps,
    sd.acceptance_rate, sd.mean_acceptance_length, sd.decode_steps, sd.inferred_step_time_s,
    c.gauge_kv_cache_usage_max, c.gauge_kv_cache_usage_mean, c.gauge_running_max, c.gauge_waiting_max,
    c.gauge_preemptions,
    c.check_tokens_per_chunk_ok, c.check_completion_tokens_ok, c.server_valid, c.server_problem,
    c.host_cpus, c.host_busy_share, c.host_ours_share, c.host_other_share, c.host_steal_share,
    coalesce(json_extract(c.variant_config, '$.aa_control')::BOOLEAN, false) AS aa_control,
    -- the deployment's effective engine configuration beyond speculation (tasks/metrics/engine_config.py)
    json_extract_string(d.extra, '$.effective_key') AS effective_key,
    -- what else can change a result, from the deployment (migration 0018, tasks/launch/provenance.py):
    -- NULL where the deployment recorded it as absent (a cluster node, an endpoint) or predates it
    d.target_digest, d.env_digest, d.overlays_digest, d.hardware
FROM latest_ok c
JOIN attempts a USING (campaign_id, cell_id)
LEFT JOIN deployments d ON d.deployment_id = c.deployment_id
LEFT JOIN spec_decode sd USING (cell_key);

-- Each speculative or A/A-control cell against the plain cell of the same campaign, workload (stratum and
-- file hash), load (mode, concurrency, rate), endpoint, sampling, engine settings and repeat. Ratios > 1 mean
-- faster. The baseline is never the A/A control (a second plain arm). v_speedup and v_aa read it.
CREATE OR REPLACE VIEW v_against_plain AS
SELECT
    s.aa_control,
    s.campaign_id, s.cell_id, s.variant, s.method, s.k, s.repeat, s.workload,
    s.load_label, s.load_mode, s.concurrency, s.rate,
    b.cell_id AS baseline_cell_id, b.variant AS baseline_variant,
    s.output_throughput_tok_s, b.output_throughput_tok_s AS baseline_output_throughput_tok_s,
    s.output_throughput_tok_s / NULLIF(b.output_throughput_tok_s, 0) AS throughput_speedup,
    s.request_throughput_rps / NULLIF(b.request_throughput_rps, 0) AS request_throughput_speedup,
    s.ttft_p50_s, b.ttft_p50_s AS baseline_ttft_p50_s, b.ttft_p50_s / NULLIF(s.ttft_p50_s, 0) AS ttft_p50_speedup,
    s.ttft_p95_s, b.ttft_p95_s AS baseline_ttft_p95_s, b.ttft_p95_s / NULLIF(s.ttft_p95_s, 0) AS ttft_p95_speedup,
    s.tpot_p50_s, b.tpot_p50_s AS baseline_tpot_p50_s, b.tpot_p50_s / NULLIF(s.tpot_p50_s, 0) AS tpot_p50_speedup,
    s.tpot_p95_s, b.tpot_p95_s AS baseline_tpot_p95_s, b.tpot_p95_s / NULLIF(s.tpot_p95_s, 0) AS tpot_p95_speedup,
    s.acceptance_rate, s.mean_acceptance_length,
    s.server_valid AND b.server_valid AS server_valid,
    -- true: the engine ran with other settings than plain's beyond speculation (a confound; NULL: unknown)
    CASE WHEN s.effective_key IS NULL OR b.effective_key IS NULL THEN NULL
         ELSE s.effective_key <> b.effective_key END AS confounded,
    -- the provenance fields in which the two arms' deployments differ (recorded on one side only counts,
    -- absent on both does not): analysis.validity names them in the verdict's reasons
    list_filter([
        CASE WHEN s.target_digest IS DISTINCT FROM b.target_digest THEN 'target_digest' END,
        CASE WHEN s.env_digest IS DISTINCT FROM b.env_digest THEN 'env_digest' END,
        CASE WHEN s.overlays_digest IS DISTINCT FROM b.overlays_digest THEN 'overlays_digest' END,
        CASE WHEN s.hardware IS DISTINCT FROM b.hardware THEN 'hardware' END
    ], lambda x: x IS NOT NULL) AS provenance_differences
FROM v_cells s
JOIN v_cells b
  ON b.method = 'none' AND NOT b.aa_control
 AND (s.method <> 'none' OR s.aa_control)
 AND b.campaign_id = s.campaign_id
 AND b.workload = s.workload
 AND b.workload_sha256 IS NOT DISTINCT FROM s.workload_sha256
 AND b.load_mode = s.load_mode
 AND b.concurrency IS NOT DISTINCT FROM s.concurrency
 AND b.rate IS NOT DISTINCT FROM s.rate
 AND b.endpoint IS NOT DISTINCT FROM s.endpoint
 AND b.sampling_key = s.sampling_key
 AND b.engine_key = s.engine_key
 AND b.repeat = s.repeat;

-- Each speculative cell against its plain cell (v_against_plain). Ratios > 1 mean faster.
CREATE OR REPLACE VIEW v_speedup AS
SELECT * EXCLUDE (aa_control) FROM v_against_plain WHERE method <> 'none';

-- The A/A control's cells against the plain cell of the same workload, load, setting and repeat: the same
-- columns as v_speedup; its "speedups" measure how far two identically launched plain arms differ.
CREATE OR REPLACE VIEW v_aa AS
SELECT * EXCLUDE (aa_control) FROM v_against_plain WHERE aa_control;

-- Speculation figures of every speculative cell whose server counters are valid (no restart).
CREATE OR REPLACE VIEW v_acceptance AS
SELECT
    v.campaign_id, v.cell_id, v.variant, v.method, v.k, v.repeat, v.workload,
    v.load_label, v.load_mode, v.concurrency, v.rate, v.drafter_sha256,
    sd.drafts, sd.draft_tokens, sd.accepted_tokens, sd.acceptance_rate, sd.mean_acceptance_length,
    (SELECT list(p.acceptance_rate ORDER BY p.position) FROM spec_decode_positions p
      WHERE p.cell_key = v.cell_key) AS acceptance_rate_per_position,
    sd.decode_steps, sd.inferred_step_time_s, v.tokens_per_chunk_mean, v.check_tokens_per_chunk_ok,
    v.tpot_p50_s,
    -- the interval of the variant's acceptance at this workload and load over its prompts (and launches),
    -- from the latest analysis (analysis_acceptance); NULL before the campaign is analysed or where the
    -- requests carry no acceptance of their own
    aa.mean_acceptance_length AS mean_acceptance_length_prompts,
    aa.mean_acceptance_length_low, aa.mean_acceptance_length_high,
    aa.acceptance_rate_low, aa.acceptance_rate_high, aa.acceptance_interval
FROM v_cells v
JOIN spec_decode sd USING (cell_key)
LEFT JOIN analysis_acceptance aa
  ON aa.campaign_id = v.campaign_id AND aa.variant = v.variant AND aa.workload = v.workload
 AND aa.load_label = v.load_label
WHERE v.method <> 'none' AND v.server_valid IS NOT FALSE;

-- The same, one row per cell and draft position.
CREATE OR REPLACE VIEW v_acceptance_positions AS
SELECT
    v.campaign_id, v.cell_id, v.variant, v.method, v.k, v.repeat, v.workload, v.load_label,
    p.position, p.acceptance_rate
FROM v_cells v
JOIN spec_decode_positions p USING (cell_key)
WHERE v.method <> 'none' AND v.server_valid IS NOT FALSE;

-- Acceptance and speedup against context length (issue 33): the speculative cells of prompt-length buckets,
-- strata named `<stratum>-len-<lower edge in tokens>` (workloads/length_buckets.py), one row per campaign,
-- variant, bucket and load over the repeats: the counters summed, the rate and mean length from the sums, the
-- mean prompt tokens the server counted, and the geometric mean of the cells' throughput ratios over plain.
CREATE OR REPLACE VIEW v_context_length AS
WITH bucketed AS (
    SELECT a.*, v.prompt_tokens, v.requests_ok,
        regexp_extract(a.workload, '^(.+)-len-([0-9]{4,})$', 1) AS base_stratum,
        CAST(regexp_extract(a.workload, '^(.+)-len-([0-9]{4,})$', 2) AS INTEGER) AS bucket_tokens
    FROM v_acceptance a
    JOIN v_cells v USING (campaign_id, cell_id)
    WHERE regexp_full_match(a.workload, '.+-len-[0-9]{4,}')
)
SELECT
    b.campaign_id, b.variant, b.method, b.k, b.base_stratum, b.bucket_tokens, b.workload,
    b.load_label, b.load_mode, b.concurrency, b.rate,
    count(*) AS cells,
    sum(b.prompt_tokens) / NULLIF(sum(b.requests_ok), 0) AS mean_prompt_tokens,
    sum(b.drafts) AS drafts, sum(b.draft_tokens) AS draft_tokens, sum(b.accepted_tokens) AS accepted_tokens,
    sum(b.accepted_tokens) / NULLIF(sum(b.draft_tokens), 0) AS acceptance_rate,
    1 + sum(b.accepted_tokens) / NULLIF(sum(b.drafts), 0) AS mean_acceptance_length,
    exp(avg(ln(s.throughput_speedup)) FILTER (WHERE s.throughput_speedup > 0)) AS throughput_speedup,
    count(s.throughput_speedup) FILTER (WHERE s.throughput_speedup > 0) AS speedup_repeats
FROM bucketed b
LEFT JOIN v_speedup s ON s.campaign_id = b.campaign_id AND s.cell_id = b.cell_id
GROUP BY ALL;

-- Serving capacity per campaign, variant, workload and load (open-loop rate or closed-loop concurrency),
-- over repeats: achieved throughput, goodput, tail latency and whether every repeat met the campaign's SLO.
CREATE OR REPLACE VIEW v_capacity AS
WITH per_cell AS (
    SELECT
        v.*,
        coalesce(c.slo_ttft_p99_s, v.goodput_ttft_slo_s) AS slo_ttft,
        coalesce(c.slo_tpot_p99_s, v.goodput_tpot_slo_s) AS slo_tpot
    FROM v_cells v
    LEFT JOIN campaigns c USING (campaign_id)
)
SELECT
    campaign_id, variant, method, k, workload, load_mode, load_label, concurrency, rate AS offered_rate_rps,
    count(*) AS repeats,
    avg(request_throughput_rps) AS achieved_rps,
    avg(output_throughput_tok_s) AS output_throughput_tok_s,
    avg(goodput_rate_rps) AS goodput_rps,
    avg(goodput_share) AS goodput_share,
    avg(ttft_p99_s) AS ttft_p99_s,
    max(ttft_p99_s) AS ttft_p99_s_worst,
    avg(tpot_p99_s) AS tpot_p99_s,
    max(tpot_p99_s) AS tpot_p99_s_worst,
    any_value(slo_ttft) AS slo_ttft_p99_s,
    any_value(slo_tpot) AS slo_tpot_p99_s,
    -- false as soon as one repeat misses a limit; true when every repeat has both figures and meets both
    CASE
        WHEN bool_or(ttft_p99_s > slo_ttft OR tpot_p99_s > slo_tpot) THEN false
        WHEN count(ttft_p99_s) = count(*) AND count(tpot_p99_s) = count(*)
             AND count(slo_ttft) = count(*) AND count(slo_tpot) = count(*) THEN true
    END AS slo_met
FROM per_cell
GROUP BY campaign_id, variant, method, k, workload, load_mode, load_label, concurrency, rate;

-- One row per verdict: which speculative variant was judged against which control pairs, whether it passed,
-- and the verdict in words. `verdict_rank` 1 is the latest verdict per campaign and variant.
CREATE OR REPLACE VIEW v_gate AS
SELECT
    g.campaign_id,
    g.treatment_variant,
    g.verdict_id,
    g.treatment_capture_a,
    g.treatment_capture_b,
    g.control_pairs,
    g.passed,
    g.outcome,
    g.claim AS verdict,
    g.failed_checks,
    g.n_prompts,
    g.exact_match_rate,
    g.envelope_exact_match_min,
    g.mean_prefix_fraction,
    g.mean_edit_distance,
    g.created_utc,
    row_number() OVER (
        PARTITION BY g.campaign_id, g.treatment_variant ORDER BY g.created_utc DESC, g.verdict_id DESC
    ) AS verdict_rank
FROM gate_verdicts g;

-- Correctness under sampling (docs/gate.md "Under sampling"): one row per check, arm ('treatment': plain vs
-- the variant; 'null': plain vs a second plain launch) and position (0..m-1; -1 the whole m-token prefix): the
-- mean TV over prompts, the mean TV chance alone gives (permutations) and the mean critical TV (what a prompt
-- needs to be rejected), the band the report draws; prompts rejected after Holm; the check's verdict.
-- `check_rank` 1 is the latest check per campaign and treatment.
CREATE OR REPLACE VIEW v_sampling_check AS
WITH ranked AS (
    SELECT
        *,
        row_number() OVER (
            PARTITION BY campaign_id, treatment_variant ORDER BY created_utc DESC, check_id DESC
        ) AS check_rank
    FROM sampling_checks
)
SELECT
    s.campaign_id, s.treatment_variant, s.check_id, s.method, s.outcome, s.passed, s.claim, s.reasons,
    s.temperature, s.samples, s.tokens, s.n_prompts, s.rejected_prompts, s.null_rejected_prompts, s.alpha,
    s.correction, s.created_utc, s.check_rank, r.arm, r.position,
    avg(r.tv) AS mean_tv,
    max(r.tv) AS max_tv,
    avg(r.null_tv_mean) AS mean_null_tv,
    avg(r.critical_tv) AS mean_critical_tv,
    min(r.p_value) AS min_p_value,
    count(DISTINCT r.prompt_id) FILTER (WHERE r.rejected) AS rejected_in_arm
FROM ranked s JOIN sampling_check_rows r USING (check_key)
GROUP BY ALL;

-- One row per successfully profiled window: what share of measured engine time went to draft tokens that
-- were rejected (wasted_share), and the rest of the split. The latest window per (campaign, variant, load,
-- workload, profiler) comes first in `window_rank`.
CREATE OR REPLACE VIEW v_profile_waste AS
SELECT
    p.campaign_id, p.profile_id, p.deployment_id, p.variant, p.method, p.k, p.workload,
    p.load_label, p.concurrency, p.profiler,
    p.wasted_share, p.wasted_share_of_added,
    p.drafting_share, p.verification_share, p.rejection_share, p.other_share, p.useful_share,
    p.added_share, p.wasted_drafting_share, p.wasted_verification_share,
    p.acceptance_rate, p.drafts, p.draft_tokens, p.accepted_tokens,
    p.engine_s, p.steps, p.apportioning, p.cross_check_ok, p.engine_version, p.started_utc,
    row_number() OVER (
        PARTITION BY p.campaign_id, p.variant, p.load_label, p.workload, p.profiler
        ORDER BY p.started_utc DESC, p.profile_id DESC
    ) AS window_rank
FROM profiles p
WHERE p.status = 'ok';

-- One row per analysed campaign: is it trustworthy? Its A/A gap with interval, the spread of plain's repeats,
-- the client's measured error at the campaign's heaviest load, and `valid` (analysis/validity.py).
CREATE OR REPLACE VIEW v_validity AS
SELECT
    v.campaign_id, v.analysis_id, v.verdict, v.valid, v.reasons,
    v.aa_variant, v.aa_estimate, v.aa_low, v.aa_high, v.aa_gap, v.aa_repeats, v.aa_interval, v.max_aa_gap,
    v.repeat_spread, v.repeat_spread_cells, v.max_repeat_spread,
    v.client_ttft_error_p50_s, v.client_ttft_error_p99_s, v.client_tpot_error_p50_s, v.client_tpot_error_p99_s,
    v.client_send_lag_p99_s, v.client_concurrency, v.smallest_latency_difference_s, v.client_error_ok
FROM analysis_validity v;

-- The latest simulation of each campaign (analysis/simulate/, docs/simulate.md): its projections, with the
-- run's cost-model fit. Older simulations with other settings stay in tree_sim.
CREATE OR REPLACE VIEW v_tree_sim AS
WITH latest AS (
    SELECT * FROM tree_sim_runs
    QUALIFY row_number() OVER (PARTITION BY campaign_id ORDER BY created_utc DESC, simulation_id DESC) = 1
)
SELECT t.*, l.fit_points, l.fit_rms_residual, l.fit_max_residual, l.outputs_capture
FROM tree_sim t
JOIN latest l USING (campaign_id, simulation_id);

-- One row per adaptation confirmation, stratum and load (tasks/adapt.py, docs/adaptation.md): the benefit
-- rule's verdict on the new head against the old one, beside the mean acceptance length, throughput and
-- TPOT p50 ratios (new / old; TPOT old / new, > 1 = new faster) with their intervals over repeats, and the
-- gate taken with the new head serving. `adopt`: this stratum should get the adapted head. A confirmation
-- that failed before any verdict has one row with a null stratum (its status and error say why).
CREATE OR REPLACE VIEW v_adaptation AS
SELECT
    a.campaign_id, a.adaptation_id, a.deployment_id, a.variant, a.target_stratum, v.stratum, v.load_label,
    v.target, v.adopt, v.reason, a.gain_metric, v.estimate AS gain, v.ci_low AS gain_low, v.ci_high AS gain_high,
    v.n_repeats, v.harm_ok, v.worst_other, v.success_ok, v.gate_passed,
    mal.estimate AS mal_ratio, mal.ci_low AS mal_low, mal.ci_high AS mal_high,
    mal.old_mean AS mal_old, mal.new_mean AS mal_new,
    thr.estimate AS throughput_ratio, thr.ci_low AS throughput_low, thr.ci_high AS throughput_high,
    tpot.estimate AS tpot_ratio, tpot.ci_low AS tpot_low, tpot.ci_high AS tpot_high,
    a.min_effect, a.max_harm, a.old_sha256, a.new_sha256, a.new_path, a.swapped_back, a.gate_verdict_id,
    a.gate_outcome, a.adopt_strata, a.status, a.error, a.started_utc, a.ended_utc
FROM adaptations a
LEFT JOIN adaptation_verdicts v ON v.adaptation_key = a.adaptation_key
LEFT JOIN adaptation_comparisons mal
    ON mal.adaptation_key = v.adaptation_key AND mal.stratum = v.stratum AND mal.load_label = v.load_label
    AND mal.metric = 'mean_acceptance_length'
LEFT JOIN adaptation_comparisons thr
    ON thr.adaptation_key = v.adaptation_key AND thr.stratum = v.stratum AND thr.load_label = v.load_label
    AND thr.metric = 'throughput'
LEFT JOIN adaptation_comparisons tpot
    ON tpot.adaptation_key = v.adaptation_key AND tpot.stratum = v.stratum AND tpot.load_label = v.load_label
    AND tpot.metric = 'tpot_p50';

-- One row per decision and measured load (flows/decide.py, artifacts/decisions.py): the per-batch-size
-- schedule recommended from a sweep (source_campaign_id), what it claims at each load (k; 0: speculation off
-- there), what the verification launch measured (its throughput over plain and over the best fixed depth
-- fixed_k, with intervals over repeats), the load's verdict (`load_outcome`, `reason`: confirmed, "faster, below
-- the minimum effect", refuted, inconclusive) beside the decision's (`outcome`) and the verification campaign's
-- validity (`validity`, `validity_reasons`), and the person's answer if there is one (the latest promotion:
-- `approved`, `approver`, `promoted_utc`, `override`; null: not answered yet), and how many launches per arm
-- the verification took of the most it could (`launches`, `max_launches`). Only the latest revision of a
-- decision (a recomputed decision is a new revision, migration 0024). A decision with no load has one row with
-- a null concurrency.
CREATE OR REPLACE VIEW v_decision AS
WITH promoted AS (
    SELECT * FROM promotions
    QUALIFY row_number() OVER (
        PARTITION BY campaign_id, decision_id ORDER BY decided_utc DESC, promotion_key DESC
    ) = 1
), latest AS (
    SELECT * FROM decisions
    QUALIFY row_number() OVER (PARTITION BY campaign_id, decision_id ORDER BY revision DESC) = 1
)
SELECT
    d.campaign_id, d.decision_id, d.revision, d.source_campaign_id, d.workload, d.family, d.method, d.outcome,
    d.validity, d.validity_reasons,
    l.concurrency, l.batch_from, l.batch_to, l.k, l.claim, l.outcome AS load_outcome, l.reason,
    l.sweep_speedup, l.sweep_interval,
    l.over_plain, l.over_plain_low, l.over_plain_high, l.over_plain_interval, l.n_repeats,
    l.over_fixed, l.over_fixed_low, l.over_fixed_high,
    d.fixed_k, d.tolerance, d.confidence, d.schedule, d.speculative_config, d.verification_spec,
    d.summary, d.caveats, d.created_utc,
    p.approved, p.approver, p.decided_utc AS promoted_utc, p.override,
    d.choice, d.choice_reason, d.traffic, d.options, d.launches, d.max_launches
FROM latest d
LEFT JOIN decision_loads l ON l.decision_key = d.decision_key
LEFT JOIN promoted p ON p.campaign_id = d.campaign_id AND p.decision_id = d.decision_id
ORDER BY d.campaign_id, d.created_utc, d.decision_id, l.concurrency;

-- Speedup against plain with its interval, per variant, workload, load and metric, from the latest analysis
-- (analysis_speedup): `interval` names the method and n ("n=2, t on log-ratios, launch variance pooled from
-- 3 campaigns (2026-12-01..2026-12-04) 95%"); ci_low/ci_high are NULL where there is no interval.
CREATE OR REPLACE VIEW v_speedup_interval AS
SELECT
    s.campaign_id, s.analysis_id, s.variant, s.method, s.k, s.workload, s.load_mode, s.load_label,
    s.concurrency, s.rate, s.metric, s.estimate, s.ci_low, s.ci_high, s.n_repeats AS n, s.interval,
    s.interval_excludes_one
FROM analysis_speedup s;

-- GPU telemetry per cell (tasks/metrics/gpu_telemetry.py, docs/telemetry.md): one row per cell of v_cells (its
-- latest ok attempt) and GPU. A cell without GPUs has one row with a NULL gpu_index and `telemetry_status`
-- saying why ('absent: no NVML (...) and no nvidia-smi on PATH'): its figures are NULL, never zeros; a cell
-- written before telemetry says 'not recorded'. Energy per output token: the window's energy over the cell's
-- completion tokens (successful measured requests); `cell_energy_j` sums the GPUs.
CREATE OR REPLACE VIEW v_gpu_telemetry AS
SELECT
    c.campaign_id, c.cell_id, c.attempt, c.cell_key, c.variant, c.method, c.k, c.repeat, c.workload,
    c.load_label, c.concurrency, c.rate, c.launcher, c.completion_tokens, c.output_throughput_tok_s,
    coalesce(w.state, 'not recorded') AS telemetry_state,
    coalesce(w.telemetry_status, 'not recorded (the cell was written before GPU telemetry)') AS telemetry_status,
    w.source AS telemetry_source, w.interval_s AS telemetry_interval_s, w.window_s AS telemetry_window_s,
    w.gpus, w.energy_j AS cell_energy_j, w.energy_j / nullif(c.completion_tokens, 0) AS cell_energy_per_token_j,
    g.gpu_index, g.gpu_name, g.samples, g.energy_j, g.energy_counter_j,
    g.energy_j / nullif(c.completion_tokens, 0) AS energy_per_output_token_j,
    g.mean_power_w, g.max_power_w, g.peak_memory_mib, g.mean_memory_mib, g.mean_utilization_pct,
    g.mean_sm_clock_mhz, g.first_sample_s, g.last_sample_s
FROM v_cells c
LEFT JOIN gpu_telemetry_cells w USING (cell_key)
LEFT JOIN gpu_telemetry g USING (cell_key)
ORDER BY c.campaign_id, c.cell_id, g.gpu_index;

-- Percentiles from the latency sketches stored at ingest (cell_sketches, migration 0017; warehouse/sketches.py,
-- docs/warehouse.md "Percentiles from sketches"). sketch_value: what a DDSketch bucket answers (the ddsketch
-- package's LogarithmicMapping at relative accuracy 0.01: 2 gamma^k / (1 + gamma), gamma = 1.0202...;
-- -2147483648 is the zero bucket). sketch_quantile: between the answers of the two ranks around q (n - 1),
-- interpolated as quantile_cont and numpy interpolate between values: within 1% of the exact percentile.
CREATE OR REPLACE MACRO sketch_value(bucket) AS
    CASE WHEN bucket = -2147483648 THEN 0.0
         ELSE pow(2.0, bucket / 34.65620375188817) * (2.0 / (1 + 1.02020202020202)) END;
CREATE OR REPLACE MACRO sketch_quantile(lo_bucket, hi_bucket, q, n) AS
    sketch_value(lo_bucket)
    + (q * (n - 1) - floor(q * (n - 1))) * (sketch_value(coalesce(hi_bucket, lo_bucket)) - sketch_value(lo_bucket));

-- The percentiles of walked sketches: `walked` names a relation (a CTE of the caller) of rows (sketch_key,
-- metric, bucket, cum, n): per sketch and metric its buckets with their running count in bucket order and its
-- total. Per sketch_key and metric: n (values) and p50/p90/p95/p99 in seconds, from the first buckets whose
-- running count passes the ranks around q (n - 1): one aggregate, no window.
CREATE OR REPLACE MACRO sketch_ranked(walked) AS TABLE
WITH ranks AS (
    SELECT sketch_key, metric, any_value(n)::BIGINT AS n,
        min(bucket) FILTER (WHERE cum > floor(0.50 * (n - 1))) AS p50_lo,
        min(bucket) FILTER (WHERE cum > floor(0.50 * (n - 1)) + 1) AS p50_hi,
        min(bucket) FILTER (WHERE cum > floor(0.90 * (n - 1))) AS p90_lo,
        min(bucket) FILTER (WHERE cum > floor(0.90 * (n - 1)) + 1) AS p90_hi,
        min(bucket) FILTER (WHERE cum > floor(0.95 * (n - 1))) AS p95_lo,
        min(bucket) FILTER (WHERE cum > floor(0.95 * (n - 1)) + 1) AS p95_hi,
        min(bucket) FILTER (WHERE cum > floor(0.99 * (n - 1))) AS p99_lo,
        min(bucket) FILTER (WHERE cum > floor(0.99 * (n - 1)) + 1) AS p99_hi
    FROM query_table(walked) GROUP BY sketch_key, metric
)
SELECT sketch_key, metric, n,
    sketch_quantile(p50_lo, p50_hi, 0.50, n) AS p50_s,
    sketch_quantile(p90_lo, p90_hi, 0.90, n) AS p90_s,
    sketch_quantile(p95_lo, p95_hi, 0.95, n) AS p95_s,
    sketch_quantile(p99_lo, p99_hi, 0.99, n) AS p99_s
FROM ranks;

-- The same from summed counts: `counts` names rows (sketch_key, metric, bucket, count), count summed per
-- bucket; the running counts come from a window walk.
CREATE OR REPLACE MACRO sketch_percentiles(counts) AS TABLE
WITH walked AS (
    SELECT sketch_key, metric, bucket,
           sum(count) OVER (PARTITION BY sketch_key, metric ORDER BY bucket ROWS UNBOUNDED PRECEDING) AS cum,
           sum(count) OVER (PARTITION BY sketch_key, metric) AS n
    FROM query_table(counts)
)
SELECT * FROM sketch_ranked(walked);

-- Per cell (its latest ok attempt, as v_cells) and metric (ttft, tpot, e2e, itl): p50/p90/p95/p99 in seconds
-- from its sketch, all blocks merged; n = values (itl: tokens).
CREATE OR REPLACE VIEW v_sketch_percentiles AS
WITH latest_ok AS (
    SELECT cell_key, campaign_id, cell_id, variant, method, k, repeat, workload, load_mode, load_label,
           concurrency, rate
    FROM cells WHERE status = 'ok'
    QUALIFY row_number() OVER (PARTITION BY campaign_id, cell_id ORDER BY attempt DESC) = 1
), summed AS (
    SELECT cell_key AS sketch_key, metric, bucket, sum(count)::BIGINT AS count
    FROM cell_sketches WHERE cell_key IN (SELECT cell_key FROM latest_ok)
    GROUP BY cell_key, metric, bucket
)
SELECT
    c.campaign_id, c.cell_id, c.cell_key, c.variant, c.method, c.k, c.repeat, c.workload, c.load_mode,
    c.load_label, c.concurrency, c.rate, r.metric, r.n, r.p50_s, r.p90_s, r.p95_s, r.p99_s
FROM sketch_percentiles(summed) r JOIN latest_ok c ON c.cell_key = r.sketch_key;

-- Per campaign, variant, workload and load (over all their cells: repeats, blocks) and metric: the cells'
-- sketches merged (counts summed per bucket), read from the rollup kept at ingest (group_sketches, migration
-- 0022: per group the merged counts with their running count `cum` and total `n`; sketch_groups: its names),
-- so each percentile is one aggregate per group and metric: the first bucket whose running count passes the
-- rank, as sketch_percentiles walks them. The exact alternative, slower as the warehouse grows:
-- quantile_cont over `requests` (docs/warehouse.md "Percentiles from sketches").
CREATE OR REPLACE VIEW v_sketch_percentiles_merged AS
WITH walked AS (SELECT group_no AS sketch_key, metric, bucket, cum, n FROM group_sketches)
SELECT
    g.campaign_id, g.variant, g.method, g.k, g.workload, g.load_mode, g.load_label, g.concurrency, g.rate,
    g.cells, r.metric::VARCHAR AS metric, r.n, r.p50_s, r.p90_s, r.p95_s, r.p99_s
FROM sketch_ranked(walked) r JOIN sketch_groups g ON g.group_no = r.sketch_key;
