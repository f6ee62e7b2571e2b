"""Figure generators: each module has make(outdir) -> [paths]; `minipar figures` runs them all.

Every figure draws through :func:`pyplot` and writes through :func:`save` (matplotlib, imported only when a figure is drawn, on
the Agg backend: files, no window), and reports the runs it waits for with :func:`progress`.
"""

# Where figures go when no folder is named: never the committed figures/ (that takes `--into figures`)
DEFAULT_OUT = "figures-out"


def pyplot():
    """matplotlib's pyplot, drawing into files (the Agg backend): the one set-up of every figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig, path, dpi: int = 110, tight: bool = False) -> str:
    """Write ``fig`` to ``path`` (laid out first if ``tight``), close it, and return the path as a str."""
    if tight:
        fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)
    return str(path)


def progress(what: str) -> None:
    """One line saying which run a figure is waiting for (``minipar figures``, the tour), shown at once."""
    print(f"    {what} ...", flush=True)
