"""fleet-trio: a GPU fleet agent built on Trio's structured concurrency."""

__version__ = "0.1.0"
