"""`timbench diagnose`: where the engine-trainer mismatch comes from.

Each side's logprobs are measured against a float64 exact-kernel reference
(`forward`), the gap is attributed to the two sides and to each spec key
(`attribution`), broken down by token probability, position, argmax and MoE
routing (`views`), and pinned to the first layer where engine decode and
trainer forward part (`layers`, via the engine replay in `replay`); `run`
ties them together, `figures` draws them, `table` runs a condition table, `cli`
is the command.
"""

from .run import align_groups, diagnose, diagnose_rollouts

__all__ = ["align_groups", "diagnose", "diagnose_rollouts"]
