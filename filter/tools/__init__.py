"""Operator tools: explain, skip-rate, provision (the CLI in `filter.cli` dispatches to them)."""
