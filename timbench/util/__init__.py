"""Utilities importing nothing else of timbench: atomic writes, locks, input readers, coercion, threads, lazy export."""
