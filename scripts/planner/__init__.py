"""The planner: a cluster's TTFT, TPOT and goodput per prefill:decode split, predicted from a cost profile
(docs/planner.md)."""
