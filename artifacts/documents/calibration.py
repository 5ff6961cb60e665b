"""Client calibrations: calibration/<calibration_id>.json (ClientCalibrationDocument)."""

from __future__ import annotations

from artifacts.documents.base import Document, Number, Text, Time, Whole
from artifacts.documents.blocks import HostFacts, ToolFacts


class ClientCalibrationDocument(Document):
    """calibration/<calibration_id>.json, written once at a campaign's start by tasks.load.calibration: the
    client's TTFT and TPOT error (measured - injected), its send lag and the emulator's own lateness, at the
    campaign's heaviest load against the emulator on the machine that runs the campaign's load."""

    calibration_id: Text
    campaign_id: Text
    started_utc: Time | None = None
    ended_utc: Time | None = None
    mode: Text  # closed | open
    concurrency: Whole
    rate: Number | None = None
    requests: Whole
    requests_ok: Whole
    requests_failed: Whole
    injected_ttft_s: Number
    injected_step_s: Number
    ttft_error_p50_s: Number | None = None
    ttft_error_p99_s: Number | None = None
    tpot_error_p50_s: Number | None = None
    tpot_error_p99_s: Number | None = None
    send_lag_p50_s: Number | None = None
    send_lag_p99_s: Number | None = None
    emulator_late_p50_s: Number | None = None
    emulator_late_p99_s: Number | None = None
    tool: ToolFacts | None = None
    host: HostFacts | None = None
