"""Measurement pieces used by the worker: timer, memory, events, correctness, flops, telemetry."""
