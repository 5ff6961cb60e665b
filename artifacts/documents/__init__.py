"""The raw documents, typed: what each JSON file of the raw tree holds (artifacts.layout says where), one
module per artifact kind, as warehouse/kinds/ has one per kind it ingests.

Writers build these models and write them (artifacts.store.write_json); the warehouse reads the same files
through the same models (warehouse.kinds). The models accept every document written so far: fields that
older writers did not write are optional, fields no model declares are kept (`extra="allow"`), so a
document read and written again keeps them.

    base         the value types (Number, Whole, Text, Flag, Time), Document, Configuration (redacted when
                 dumped), the warehouse's column marks (Column, Columns, stored_columns, StoredReader)
    blocks       the blocks several kinds carry (ToolFacts, HostFacts, VariantFacts)
    campaigns    campaign.json (CampaignRecord), runs/*.json (RunRecord)
    deployments  deployment.json (DeploymentFacts; EngineFacts, DrafterFacts, EffectiveEngineConfig)
    provenance   deployment.json's `provenance` (ProvenanceFacts: target, environment, overlays, hardware)
    cells        cells/<cell_id>.a<n>/: meta.json (CellMeta), summary.json (CellSummary), requests.parquet
                 (REQUEST_SCHEMA), gauges.parquet (GAUGE_SCHEMA)
    captures     captures/<capture_id>/: meta.json (CaptureMeta), outputs.parquet (OUTPUT_SCHEMA)
    gates        gates/<verdict_id>.json (GateVerdictDocument)
    profiles     profiles/<profile_id>/: meta.json (ProfileMeta), breakdown.json (ProfileBreakdown)
    capacity     capacity/<search_id>.json (CapacitySearchDocument)
    calibration  calibration/<calibration_id>.json (ClientCalibrationDocument)
    adaptations  adaptations/<adaptation_id>.json (AdaptationDocument)
    decisions    decisions/<decision_id>.json (DecisionDocument), promotions/<decision_id>.json
                 (PromotionDocument)
    drafters     RAW/drafters/<drafter_id>/: card.json (DrafterCard), curve.parquet (CURVE_SCHEMA)

Every public name is importable from here (`from artifacts.documents import CellSummary`). A new kind: a
module here (copy the closest one), its names below, and its reader in warehouse/kinds/ (docs/design.md).
"""

from __future__ import annotations

from artifacts.documents.adaptations import (
    AdaptationBlock,
    AdaptationComparison,
    AdaptationDocument,
    AdaptationGate,
    AdaptationVerdict,
    HeadFacts,
    SwapFacts,
)
from artifacts.documents.base import (
    TYPE_ERRORS,
    Column,
    Columns,
    Configuration,
    Document,
    Flag,
    Number,
    StoredColumn,
    StoredReader,
    Text,
    Time,
    Whole,
    stored_columns,
    utc_datetime,
)
from artifacts.documents.blocks import HostFacts, ToolFacts, VariantFacts
from artifacts.documents.calibration import ClientCalibrationDocument
from artifacts.documents.campaigns import (
    CampaignRecord,
    ImportFacts,
    PlannedSlot,
    RunRecord,
    SloFacts,
    SpecFacts,
)
from artifacts.documents.capacity import CapacitySearchDocument, SearchBound, SearchLimits, SearchPoint
from artifacts.documents.captures import OUTPUT_SCHEMA, CaptureMeta, CorpusFacts
from artifacts.documents.cells import (
    ERROR_CLASSES,
    GAUGE_SCHEMA,
    REQUEST_OPTIONAL_COLUMNS,
    REQUEST_SCHEMA,
    BurstCheck,
    CellMeta,
    CellSummary,
    CrossChecks,
    Distribution,
    ErrorClass,
    GaugeSummary,
    GenerationTokensCheck,
    Goodput,
    HostLoad,
    Latency,
    LoadFacts,
    RequestCounts,
    SamplingFacts,
    Speculation,
    TokensPerChunkCheck,
    WorkloadFacts,
)
from artifacts.documents.decisions import (
    OUTCOMES,
    DecisionDocument,
    DecisionLoad,
    Outcome,
    PromotionDocument,
    read_decision,
)
from artifacts.documents.deployments import (
    DeploymentFacts,
    DrafterFacts,
    DrafterSwap,
    EffectiveEngineConfig,
    EngineFacts,
)
from artifacts.documents.drafters import CURVE_SCHEMA, DrafterCard, DrafterData, DrafterLosses, DrafterSide
from artifacts.documents.gates import (
    Agreement,
    CaptureRef,
    ComparedPair,
    ControlPair,
    Envelope,
    GateRule,
    GateVerdictDocument,
    Range,
)
from artifacts.documents.profiles import (
    CounterCheck,
    ProfileBreakdown,
    ProfileCounters,
    ProfileCrossChecks,
    ProfileLoad,
    ProfileMeta,
    ProfileRequests,
    ProfileWorkload,
    TraceCounts,
    TraceRef,
)
from artifacts.documents.provenance import (
    EnvironmentProvenance,
    HardwareProvenance,
    OverlayProvenance,
    ProvenanceFacts,
    TargetProvenance,
)

__all__ = [
    "CURVE_SCHEMA",
    "ERROR_CLASSES",
    "GAUGE_SCHEMA",
    "OUTCOMES",
    "OUTPUT_SCHEMA",
    "REQUEST_OPTIONAL_COLUMNS",
    "REQUEST_SCHEMA",
    "TYPE_ERRORS",
    "AdaptationBlock",
    "AdaptationComparison",
    "AdaptationDocument",
    "AdaptationGate",
    "AdaptationVerdict",
    "Agreement",
    "BurstCheck",
    "CampaignRecord",
    "CapacitySearchDocument",
    "CaptureMeta",
    "CaptureRef",
    "CellMeta",
    "CellSummary",
    "ClientCalibrationDocument",
    "Column",
    "Columns",
    "ComparedPair",
    "Configuration",
    "ControlPair",
    "CorpusFacts",
    "CounterCheck",
    "CrossChecks",
    "DecisionDocument",
    "DecisionLoad",
    "DeploymentFacts",
    "Distribution",
    "Document",
    "DrafterCard",
    "DrafterData",
    "DrafterFacts",
    "DrafterLosses",
    "DrafterSide",
    "DrafterSwap",
    "EffectiveEngineConfig",
    "EngineFacts",
    "Envelope",
    "EnvironmentProvenance",
    "ErrorClass",
    "Flag",
    "GateRule",
    "GateVerdictDocument",
    "GaugeSummary",
    "GenerationTokensCheck",
    "Goodput",
    "HardwareProvenance",
    "HeadFacts",
    "HostFacts",
    "HostLoad",
    "ImportFacts",
    "Latency",
    "LoadFacts",
    "Number",
    "Outcome",
    "OverlayProvenance",
    "PlannedSlot",
    "ProfileBreakdown",
    "ProfileCounters",
    "ProfileCrossChecks",
    "ProfileLoad",
    "ProfileMeta",
    "ProfileRequests",
    "ProfileWorkload",
    "PromotionDocument",
    "ProvenanceFacts",
    "Range",
    "RequestCounts",
    "RunRecord",
    "SamplingFacts",
    "SearchBound",
    "SearchLimits",
    "SearchPoint",
    "SloFacts",
    "SpecFacts",
    "Speculation",
    "StoredColumn",
    "StoredReader",
    "SwapFacts",
    "TargetProvenance",
    "Text",
    "Time",
    "TokensPerChunkCheck",
    "ToolFacts",
    "TraceCounts",
    "TraceRef",
    "VariantFacts",
    "Whole",
    "WorkloadFacts",
    "read_decision",
    "stored_columns",
    "utc_datetime",
]
