"""Reports on grid results: loading a result dir, per-cell summary, collapse detection, seed statistics,
leaderboard (Markdown, HTML, figures) and the `timbench compare` regression check.

Reads the layout `timbench.grid.layout` owns; never imports the runners.
"""
