"""The picture a build's model card shows: held-out zero-shot accuracy before and after the
edit, per evaluated task (term tasks and held-out controls), beside the recipe's terms and
their strengths. A PNG with no timestamp or version in it, so that the same build writes the
same bytes (the lock hashes it like every output)."""

from __future__ import annotations

import io

from ptc.compiler.recipe.plan import TermRecord
from ptc.compiler.verify.evaluate import HeldOut

PLOT_NAME = "evaluation.png"


def evaluation_png(evaluation: dict[str, HeldOut], terms: list[TermRecord]) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(evaluation)
    figure, (accuracy, strengths) = plt.subplots(
        1,
        2,
        figsize=(8, 0.45 * max(len(tasks), len(terms)) + 1.6),
        gridspec_kw={"width_ratios": [3, 2]},
    )
    rows = range(len(tasks))
    # The axis is inverted (first task on top): zero-shot above edited, as the legend reads.
    accuracy.barh(
        [r - 0.2 for r in rows],
        [100 * evaluation[t]["before"] for t in tasks],
        0.4,
        label="zero-shot",
    )
    accuracy.barh(
        [r + 0.2 for r in rows], [100 * evaluation[t]["after"] for t in tasks], 0.4, label="edited"
    )
    accuracy.set_yticks(list(rows), [f"{t} ({evaluation[t]['role']})" for t in tasks])
    accuracy.set(
        xlabel="held-out top-1 accuracy (%)", xlim=(0, 100), title="Accuracy before and after"
    )
    accuracy.invert_yaxis()
    accuracy.legend(fontsize=8, loc="lower right")
    labels = [f"{t['task']} / {t['source']}" for t in terms]
    weights = [t["weight"] for t in terms]
    strengths.barh(
        range(len(terms)), weights, color=["tab:green" if w >= 0 else "tab:red" for w in weights]
    )
    strengths.set_yticks(list(range(len(terms))), labels)
    strengths.axvline(0, color="black", linewidth=0.8)
    strengths.set(xlabel="strength", title="Terms")
    strengths.invert_yaxis()
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100, metadata={"Software": None})
    plt.close(figure)
    return buffer.getvalue()
