"""The primary endpoint: which number of a run's eval curve (accuracy T=1, `accuracy_t1` in eval.jsonl) a
verdict reads.

A grid spec declares it before it runs (`endpoint:` in the grid YAML, written to cells.json and to the grid
fingerprint only when declared, so grids without it keep theirs); a grid that declares none has the DEFAULT.
A report asked for another endpoint (`--endpoint`) labels every verdict exploratory.

- `final`: the last evaluation.
- `last3`: the mean of the last three evaluations.
- `last-half` (DEFAULT): the mean of the evaluations in the second half of the run (step >= steps / 2, steps the
  planned budget), e.g. steps 40-80 of an 80-step run: 6 evaluations instead of 1, so eval noise and one bad
  step weigh less.
- `auc`: the area under the eval curve over the run divided by its length (trapezoids over steps), the whole
  learning curve.
"""

from __future__ import annotations

import math

from ..metrics.schema import ACCURACY_T1
from ..util.registry import Registry

ENDPOINTS: Registry[str] = Registry("endpoint")
ENDPOINTS.update(
    {
        "final": "final eval accuracy T=1",
        "last3": "mean eval accuracy T=1 over the last 3 evaluations",
        "last-half": "mean eval accuracy T=1 over the last half of the run (step >= steps/2)",
        "auc": "area under the eval accuracy T=1 curve / run length",
    }
)
"""Endpoint name -> what it is, in words."""
DEFAULT = "last-half"


def check_endpoint(name, where: str = "endpoint") -> str:
    """The name if it is an endpoint, else a one-line ValueError naming the valid ones."""
    ENDPOINTS.lookup(name, where)
    return name


def endpoint_value(evals: list[dict], steps: int | None, name: str = DEFAULT) -> float | None:
    """The endpoint `name` of one run's eval rows ({step, accuracy_t1}); None without evaluations. A run that
    stopped before the window (a non-finite loss) falls back to its last evaluation."""
    check_endpoint(name)
    pts = [(int(e["step"]), float(e[ACCURACY_T1])) for e in evals if e.get(ACCURACY_T1) is not None]
    if not pts:
        return None
    accs = [a for _, a in pts]
    if name == "final":
        return accs[-1]
    if name == "last3":
        return math.fsum(accs[-3:]) / len(accs[-3:])
    if name == "last-half":
        end = steps if steps else pts[-1][0]
        window = [a for s, a in pts if s >= end / 2]
        return math.fsum(window) / len(window) if window else accs[-1]
    if len(pts) < 2 or pts[-1][0] == pts[0][0]:
        return accs[-1]
    area = math.fsum((s1 - s0) * (a0 + a1) / 2 for (s0, a0), (s1, a1) in zip(pts, pts[1:]))  # auc
    return area / (pts[-1][0] - pts[0][0])


def label(name: str, declared: str | None) -> str:
    """How a page names the endpoint it reads: pre-registered (declared by the grid), the default (the grid
    declares none), or exploratory (asked for on the command line, not what the grid declared)."""
    pre = declared or DEFAULT
    how = (
        ("pre-registered" if declared else "default; the grid declares none")
        if name == pre
        else f"EXPLORATORY: the grid's endpoint is {pre}"
    )
    return f"endpoint {name} ({ENDPOINTS[name]}; {how})"


def with_endpoint(
    rows: list[dict], evals_by_id: dict[str, list[dict]], steps_by_id: dict[str, int | None], name: str
) -> list[dict]:
    """Copies of the summary rows with the endpoint's columns: `endpoint_t1` (the endpoint of the run's eval
    curve), `gain_t1` (own gain: endpoint - the step-0 evaluation) and `endpoint_rel` (over the same seed's
    reference cell's endpoint, as `relative_accuracy_t1` is over its final accuracy)."""
    out = []
    for r in rows:
        evals = evals_by_id.get(r["id"]) or []
        e = endpoint_value(evals, steps_by_id.get(r["id"]), name)
        first = next(
            (float(x[ACCURACY_T1]) for x in evals if x.get(ACCURACY_T1) is not None and int(x["step"]) == 0), None
        )
        out.append({**r, "endpoint_t1": e, "gain_t1": None if e is None or first is None else e - first})
    by_id = {r["id"]: r for r in out}
    for r in out:
        ref = by_id.get(r["reference"]) if r.get("reference") else (r if r.get("kind") == "reference" else None)
        e, re_ = r["endpoint_t1"], (ref or {}).get("endpoint_t1")
        r["endpoint_rel"] = e / re_ if e is not None and re_ else None
    return out
