"""The comparison: what decides "changed" (canonical form, fingerprints, rows, fields, tolerance,
conditions, keyless keys) and a route compiled once to extract them. Pure, no I/O; never imports
the engine (import-linter checks it)."""
