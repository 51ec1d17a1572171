"""The decision core: the model, the ports, the engine and its rules, fingerprints, rows, times.

It imports nothing outward: no Google client, no web framework, no backend, no surface
(`make lint` checks it with import-linter; see docs/architecture.md).
"""
