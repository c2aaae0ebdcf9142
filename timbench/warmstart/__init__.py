"""Warm starts: supervised fine-tuning from scratch, the shipped checkpoints, pruned MoE proxies, and their CLIs."""
