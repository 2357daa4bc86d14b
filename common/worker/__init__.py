"""The worker runtime the prefill, decode and colocated workers share: an engine behind a ZMQ connection."""
