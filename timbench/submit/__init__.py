"""Submitting a remedy: tracks (standard cell sets, bench/tracks/), their committed results' fingerprint, and
`timbench submit`, which runs one remedy's cells and places it on the merged leaderboard (timbench.submit.run)."""
