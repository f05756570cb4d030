"""Filled by a later issue; see docs/README.md."""
