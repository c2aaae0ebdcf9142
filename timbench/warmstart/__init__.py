"""Warm starts: supervised fine-tuning from scratch and pruned MoE proxies, with their CLIs.

The shipped checkpoints they make are looked up in timbench.util.shipped."""
