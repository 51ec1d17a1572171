"""Operator tools: explain, skip-rate, provision (the CLI in `pubsub_filter.cli` dispatches to them)."""
