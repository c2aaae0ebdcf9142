"""`timbench diagnose`: where the engine-trainer mismatch comes from.

Each side's logprobs are measured against a float64 exact-kernel reference
(`forward`), the gap is attributed to the two sides and to each spec key
(`attribution`), broken down by token probability, position, argmax and MoE
routing (`views`), and pinned to the first layer where engine decode and
trainer forward part (`layers`, via the engine's teacher-forced scoring, `timbench.engine.score`); `run`
ties them together, `figures` draws them, `table` runs a condition table, `cli`
is the command.
"""

from ..util.lazy import lazy_exports

_EXPORTS = {".run": ["align_groups", "diagnose", "diagnose_rollouts"]}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = [n for names in _EXPORTS.values() for n in names]
