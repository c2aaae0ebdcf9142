"""One figure per view (matplotlib, Agg), each drawing one series per diagnosed condition.

`draw_all(rows, out_dir)` takes `[(label, report)]` (one for a single
`timbench diagnose`, many for a table) and writes attribution.png, keys.png,
probability.png, position.png, argmax.png, layers.png and, for MoE, routing.png.
Log axes leave zeros out (a zero gap is the point of the exact/exact rows and
has no log); the JSON carries every number.
"""

from __future__ import annotations

import warnings
from pathlib import Path

from ..report.figures.style import DPI, legend, plt
from ..util.atomic import atomic_path


def _pos(x):
    return x if x is not None and x > 0 else float("nan")


def _save(fig, path: Path) -> Path:
    with warnings.catch_warnings():  # long condition labels: a cramped layout is still readable
        warnings.simplefilter("ignore")
        fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(
            tmp,
            dpi=DPI,
            format="png",
            metadata={"Software": None},  # no version stamp: stable bytes
            bbox_inches="tight",
            pad_inches=0.08,
        )
    plt.close(fig)
    return path


def _axes(figsize=(9, 4.5)):
    fig, ax = plt.subplots(figsize=figsize)
    ax.set_prop_cycle(color=plt.cm.tab20.colors, marker=["o", "s", "^", "v", "D"] * 4)  # 20 distinct series
    return fig, ax


def _legend(ax):
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))  # many lines: always outside


def _lines(rows, out, name, view, ylabel, title):
    fig, ax = _axes()
    for label, r in rows:
        b = r["views"][view]
        ax.plot([x["bucket"] for x in b], [_pos(x["mean_abs_gap"]) for x in b], label=label)
    ax.set_yscale("log")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    _legend(ax)
    ax.tick_params(axis="x", labelsize=7)
    return _save(fig, out / name)


def attribution(rows, out):
    fig, ax = plt.subplots(figsize=(max(6, len(rows) * 0.6), 4.5))
    names = ("e_engine", "e_trainer", "gap")
    w = 0.2
    for k, name in enumerate(names):
        ax.bar(
            [i + k * w for i in range(len(rows))],
            [_pos(r["attribution"][name]["rms"]) for _, r in rows],
            w,
            label=f"rms {name}",
        )
    ax.scatter(
        [i + w for i in range(len(rows))],
        [_pos(r["attribution"]["models"]["quadrature"]["predicted_gap_rms"]) for _, r in rows],
        marker="_",
        s=200,
        color="k",
        label="quadrature prediction of gap",
        zorder=3,
    )
    ax.set_xticks([i + w for i in range(len(rows))], [lbl for lbl, _ in rows], rotation=60, ha="right", fontsize=7)
    ax.set_yscale("log")
    ax.set_ylabel("rms logprob error vs float64 reference")
    ax.set_title("Per-side attribution")
    legend(ax)
    return _save(fig, out / "attribution.png")


def keys(rows, out):
    fig, ax = plt.subplots(figsize=(8, max(3, len(rows) * 0.35)))
    for i, (_label, r) in enumerate(rows):
        left = 0.0
        for k in r.get("keys", {}).get("keys", []):
            if k["share"]:
                ax.barh(i, k["share"], left=left)
                if k["share"] > 0.08:
                    ax.text(
                        left + k["share"] / 2, i, f"{k['side'][0]}:{k['key']}", ha="center", va="center", fontsize=6
                    )
                left += k["share"]
    ax.set_yticks(range(len(rows)), [lbl for lbl, _ in rows], fontsize=7)
    ax.set_xlim(0, 1)
    ax.set_xlabel("share of the mean-square error added over the fp32 exact floor (e: engine, t: trainer key)")
    ax.set_title("One key at a time")
    return _save(fig, out / "keys.png")


def argmax(rows, out):
    fig, ax = plt.subplots(figsize=(max(6, len(rows) * 0.6), 4.5))
    for k, b in enumerate(("not argmax", "argmax")):
        vals = [_pos(next(x for x in r["views"]["argmax"] if x["bucket"] == b)["mean_abs_gap"]) for _, r in rows]
        ax.bar([i + k * 0.35 for i in range(len(rows))], vals, 0.35, label=f"mean |gap|, token {b} of reference")
    ax.set_yscale("log")
    ax2 = ax.twinx()
    ax2.plot(
        [i + 0.17 for i in range(len(rows))],
        [r["views"]["argmax_flip_rate"] for _, r in rows],
        "k.",
        label="argmax flip rate (engine vs trainer)",
    )
    ax2.set_ylabel("argmax flip rate")
    ax.set_xticks([i + 0.17 for i in range(len(rows))], [lbl for lbl, _ in rows], rotation=60, ha="right", fontsize=7)
    legend(ax)
    legend(ax2)
    ax.set_title("Argmax tokens vs the rest")
    return _save(fig, out / "argmax.png")


def layers(rows, out):
    fig, ax = _axes()
    for label, r in rows:
        if "layers" in r:
            lv = r["layers"]["levels"]
            ax.plot([x["level"] for x in lv], [_pos(x["max_abs_diff"]) for x in lv], label=label)
    ax.set_yscale("log")
    ax.set_ylabel("max |engine decode - trainer forward|")
    ax.set_title("Per-layer localisation (first non-zero level = where it enters)")
    _legend(ax)
    return _save(fig, out / "layers.png")


def routing(rows, out):
    moe = [(lbl, r) for lbl, r in rows if "routing_disagreement_by_layer" in r["views"]]
    if not moe:
        return None
    fig, ax = _axes()
    for label, r in moe:
        v = r["views"]["routing_disagreement_by_layer"]["engine_vs_trainer"]
        ax.plot(range(len(v)), v, label=label)
    ax.set_xlabel("layer")
    ax.set_ylabel("fraction of tokens with a different top-k expert set")
    ax.set_title("MoE routing disagreement, engine vs trainer")
    _legend(ax)
    return _save(fig, out / "routing.png")


def draw_all(rows: list[tuple[str, dict]], out_dir) -> list[Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [
        attribution(rows, out),
        keys(rows, out),
        _lines(
            rows, out, "probability.png", "probability", "mean |gap|", "|gap| by reference probability of the token"
        ),
        _lines(rows, out, "position.png", "position", "mean |gap|", "|gap| by position in the response"),
        argmax(rows, out),
        layers(rows, out),
        routing(rows, out),
    ]
    return [p for p in paths if p is not None]
