"""What a notebook shows beside its figures: check tables folded to one line, knobs to turn, and
the code a lesson is about.

    from minipar.figures.notebook import checks, knobs, source
    checks(rows, ranks=4)   # 12 checks passed, worst rel. error 2.6e-16 (tolerance 1e-12; backend numpy, 4 ranks)
    source(ring_steps)      # the function as minipar/collectives.py has it now, under its file's name
    knobs(plot_schedule, "s.png", dict(schedule="1f1b", p=4, m=8), p=(2, 8), m=[1, 8, 32])   # a static figure
                                                                       # always; the knobs in a live Jupyter kernel

``checks`` folds the rows of :func:`minipar.lessons.common.format_rows` under a summary line (an
HTML ``<details>``); a failing check is named in the summary line itself, and its table is open.
The plain-text form, which ``make notebooks`` and the notebook tests read, keeps every row.

``source`` displays functions (or classes) from the library's own files, read when the cell runs:
a stored notebook shows the code that produced its outputs, not a copy beside it that can drift
(``tests/test_prose.py`` compares every stored one with the module as it is).

``knobs`` draws ``draw(path, **defaults)`` and displays it, always: the stored notebook and a static
site show that picture. In a live kernel with ipywidgets, the knobs appear under it and redraw
the same picture in place through ``draw``, a library function (the planner, the pipeline
simulator, the ZeRO formulas); the notebook holds no logic. ``make notebooks`` stores the static
form only (:data:`STATIC`): a widget's state is worth nothing without a kernel behind it.
"""
from __future__ import annotations

import ast
import html
import importlib.util
import inspect
import os
import pathlib
import textwrap

from ..lessons.common import format_rows

# set (to anything) in the environment: knobs draw the static figure only (``make notebooks`` sets it)
STATIC = "MINIPAR_NOTEBOOK_STATIC"


def summary_line(rows, ranks=None, backend: str = "numpy") -> str:
    """One line for a table of check rows: how many passed, the worst error, and every failing one by name."""
    where = f"backend {backend}, " + ("one process" if ranks in (None, 1) else f"{ranks} ranks")
    if not rows:
        return f"no checks ({where})"
    worst = max(rows, key=lambda r: r["error"])
    failed = [r for r in rows if not r["ok"]]
    if not failed:
        return (f"{len(rows)} check{'s' * (len(rows) > 1)} passed, worst rel. error {worst['error']:.1e} "
                f"(tolerance {worst['tolerance']:.0e}; {where})")
    named = "; ".join(f"{r['what']} (rel. error {r['error']:.1e} > tolerance {r['tolerance']:.0e})" for r in failed)
    return f"FAILED {len(failed)} of {len(rows)} checks: {named} ({where})"


def fold(rows, ranks=None, backend: str = "numpy", prefix: str = "") -> dict:
    """The display bundle of a folded table: ``text/html`` (summary line, the table one click
    away, open when a check failed) and ``text/plain`` (summary line, then every row)."""
    rows = [r for r in rows if r["what"].startswith(prefix)]
    line, table = summary_line(rows, ranks, backend), format_rows(rows)
    ok = all(r["ok"] for r in rows)
    mark = "&#10003;" if ok and rows else "&#10007;"
    colour = "#1a7f37" if ok and rows else "#cf222e"
    page = (f'<details{"" if ok else " open"}><summary style="color:{colour}">{mark} {html.escape(line)}</summary>'
            f"<pre>{html.escape(table)}</pre></details>")
    return {"text/plain": f"{line}\n{table}", "text/html": page}


def checks(rows, ranks=None, backend: str = "numpy", prefix: str = ""):
    """Display the rows (those whose "what" starts with ``prefix``) folded under their summary line."""
    from IPython.display import display

    display(fold(rows, ranks, backend, prefix), raw=True)


def source_text(obj, docstring: bool = True) -> str:
    """``obj``'s source as its file has it now, under one comment line naming the file and the
    name: ``# minipar/collectives.py: ring_steps``. ``docstring=False`` leaves the docstring out
    (one comment line says where to read it)."""
    lines, _ = inspect.getsourcelines(obj)
    path = pathlib.Path(inspect.getsourcefile(inspect.unwrap(obj))).resolve()  # a decorated method: its own file
    package = pathlib.Path(__file__).resolve().parents[1]  # minipar/
    where = path.relative_to(package.parent).as_posix() if path.is_relative_to(package.parent) else path.name
    name = f"{obj.__module__}.{obj.__qualname__}"
    if not docstring:
        body = ast.parse(textwrap.dedent("".join(lines))).body[0].body
        first = body[0] if body else None
        if isinstance(first, ast.Expr) and isinstance(getattr(first, "value", None), ast.Constant) \
                and isinstance(first.value.value, str):
            opening = lines[first.lineno - 1]
            indent = opening[: len(opening) - len(opening.lstrip())]
            lines = lines[: first.lineno - 1] + [f"{indent}# (its docstring: help({name}))\n"] + lines[first.end_lineno:]
    return f"# {where}: {obj.__qualname__}\n" + "".join(lines)


def source_bundle(*objs, docstring: bool = True) -> dict:
    """The display bundle of :func:`source`: ``text/plain`` (the code) and ``text/markdown`` (the
    same code as a fenced Python block, highlighted where notebooks are rendered)."""
    text = "\n\n".join(source_text(o, docstring).rstrip("\n") for o in objs) + "\n"
    fence = "`" * max(3, 1 + max((len(run) for run in text.split("\n") if set(run) == {"`"}), default=0))
    return {"text/plain": text, "text/markdown": f"{fence}python\n{text}{fence}\n"}


def source(*objs, docstring: bool = True):
    """Display the source of each of ``objs`` (functions, classes) as the library has it now."""
    from IPython.display import display

    display(source_bundle(*objs, docstring=docstring), raw=True)


def _show(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def live() -> bool:
    """True in a running Jupyter kernel with ipywidgets installed, unless :data:`STATIC` is set."""
    if os.environ.get(STATIC) or importlib.util.find_spec("ipywidgets") is None:
        return False
    from IPython import get_ipython

    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def knobs(draw, path, defaults: dict, interactive: bool | None = None, **choices):
    """Display ``draw(path, **defaults)`` (it returns the PNG's path) and, when ``interactive`` (default: :func:`live`),
    one widget per entry of ``choices`` (a list: a dropdown; a (low, high) tuple of ints: a
    slider) that redraws the picture in place. Returns the widget box, or None when static."""
    from IPython.display import Image, display

    handle = display(Image(draw(path, **defaults)), display_id=True)
    if not (live() if interactive is None else interactive):
        knob_list = ", ".join(f"{k} {'..'.join(map(_show, v)) if isinstance(v, tuple) else ' / '.join(map(_show, v))}"
                              for k, v in choices.items())
        print(f"static figure at {', '.join(f'{k}={_show(v)}' for k, v in defaults.items())}; "
              f"run the notebook in Jupyter (the notebooks extra has ipywidgets) to turn the knobs: {knob_list}")
        return None
    import ipywidgets as w

    def widget(name, values):
        if isinstance(values, tuple):
            return w.IntSlider(value=defaults[name], min=values[0], max=values[1], description=name,
                               continuous_update=False)
        return w.Dropdown(options=list(values), value=defaults[name], description=name)

    controls = {name: widget(name, values) for name, values in choices.items()}

    def redraw(_change=None):
        values = {**defaults, **{k: c.value for k, c in controls.items()}}
        try:
            handle.update(Image(draw(path, **values)))
        except ValueError as err:  # a combination the library refuses (UsageError too): say why, in place
            handle.update(f"{', '.join(f'{k}={_show(v)}' for k, v in values.items())}: {err}")

    for c in controls.values():
        c.observe(redraw, names="value")
    box = w.HBox(list(controls.values()))
    display(box)
    return box
