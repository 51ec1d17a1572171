"""Backends behind the core's ports: state stores, publishers, decision records, fences, GCP helpers."""
