"""Mismatch metrics: the ratio maths, per-step mismatch, direction and distribution metrics, and the name schema."""
