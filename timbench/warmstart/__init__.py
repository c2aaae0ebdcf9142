"""Warm starts: supervised fine-tuning from scratch, the shipped checkpoints, and pruned MoE proxies, with their CLIs."""
