"""Compile jobs: model versions compiled into cached engines, run in the background."""
