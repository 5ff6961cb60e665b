"""A confirmation's steps as plain functions (docs/adaptation.md): its inputs resolved and checked
(`inputs`), the randomised schedule of hot swaps on one deployment and the gate's plain captures
(`deployment`), the gate, the analysis rows and the verdict document (`verdict`). The schedule, the heads and
the documents themselves are tasks/adapt.py; the flow (flows/adapt.py) runs these as its named steps."""
