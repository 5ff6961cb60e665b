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
    c.host_cpus, c.host_busy_share, c.host_ours_share, c.host_other_share,
    coalesce(json_extract(c.variant_config, '$.aa_control')::BOOLEAN, false) AS aa_control,
    -- the deployment's effective engine configuration beyond speculation (tasks/metrics/engine_config.py)
    json_extract_string(d.extra, '$.effective_key') AS effective_key
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
         ELSE s.effective_key <> b.effective_key END AS confounded
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
-- fixed_k, with intervals over repeats), the load's verdict (`load_outcome`, `reason`) beside the decision's
-- (`outcome`), and the person's answer if there is one (the latest promotion: `approved`, `approver`,
-- `promoted_utc`; null: not answered yet). A decision with no load has one row with a null concurrency.
CREATE OR REPLACE VIEW v_decision AS
WITH promoted AS (
    SELECT * FROM promotions
    QUALIFY row_number() OVER (
        PARTITION BY campaign_id, decision_id ORDER BY decided_utc DESC, promotion_key DESC
    ) = 1
)
SELECT
    d.campaign_id, d.decision_id, d.source_campaign_id, d.workload, d.family, d.method, d.outcome,
    l.concurrency, l.batch_from, l.batch_to, l.k, l.claim, l.outcome AS load_outcome, l.reason,
    l.sweep_speedup, l.sweep_interval,
    l.over_plain, l.over_plain_low, l.over_plain_high, l.over_plain_interval, l.n_repeats,
    l.over_fixed, l.over_fixed_low, l.over_fixed_high,
    d.fixed_k, d.tolerance, d.confidence, d.schedule, d.speculative_config, d.verification_spec,
    d.summary, d.caveats, d.created_utc,
    p.approved, p.approver, p.decided_utc AS promoted_utc
FROM decisions d
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
