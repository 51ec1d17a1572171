"""The configuration: the YAML file, validated into frozen models, with errors in its own words.

Imports nothing of the comparison or the engine (import-linter checks it).
"""
