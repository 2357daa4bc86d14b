"""The planner: predicts a cluster's TTFT, TPOT and goodput per prefill:decode split from a cost profile (docs/planner.md)."""
