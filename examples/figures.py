"""The look shared by every experiment figure: one colour per mechanism, legends off the data.

Every script under examples/ that draws for docs/experiments.md takes its
colours from `colour` (so "oue" is the same orange on every figure of the
page), saves through `save` (150 dpi) and puts its legend beside the axes
with `legend_outside`, where it can cover no data.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

DPI = 150

# Central histograms in black and grey, local oracles in the tab10 colours, continual
# counters in dark colours: one each, page-wide.
COLOURS = {
    "laplace": "black",
    "flat": "black",
    "stability": "dimgrey",
    "staircase": "darkgoldenrod",
    "grr": "tab:blue",
    "oue": "tab:orange",
    "olh": "tab:green",
    "hr": "tab:red",
    "hm": "tab:purple",
    "hh": "tab:brown",
    "hh b=2": "saddlebrown",
    "hh b=4": "peru",
    "rappor": "tab:pink",
    "she": "tab:olive",
    "the": "tab:cyan",
    "dse": "gold",
    "rm": "lightcoral",
    "binary tree": "midnightblue",
    "honaker": "darkcyan",
    "factorization": "darkmagenta",
}
# Trees and hierarchies by branching factor (central b=2 and local b=2 share a hue).
BRANCHING = {2: "tab:blue", 4: "tab:orange", 8: "tab:green", 16: "tab:red"}


def colour(name: str) -> str:
    """The page-wide colour of a mechanism, matched on the first known word of its label."""
    key = name.lower()
    if key in COLOURS:
        return COLOURS[key]
    for label in (k for k in COLOURS if " " in k):  # two-word labels first: "hh b=2"
        if label in key:
            return COLOURS[label]
    for word in key.replace("(", " ").replace(",", " ").split():
        if word.startswith("b=") and word[2:].isdigit() and int(word[2:]) in BRANCHING:
            return BRANCHING[int(word[2:])]
        if word in COLOURS:
            return COLOURS[word]
    raise KeyError(f"no colour for {name!r}; add it to examples/figures.py COLOURS")


def legend_outside(axis, **options) -> None:
    """The legend to the right of the axes (the figure grows to hold it)."""
    axis.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0,
                fontsize=options.pop("fontsize", 8), **options)  # fmt: skip


def save(figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=DPI, bbox_inches="tight")
    plt.close(figure)
    return path


def subplots(*args, **kwargs):
    return plt.subplots(*args, **kwargs)
