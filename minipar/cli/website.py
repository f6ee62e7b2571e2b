"""The course site: which pages MkDocs builds, read from the registry at build time.

    make site                                   # = python -m mkdocs build --strict (mkdocs.yml)
    python -m http.server -d site 8000          # then open http://localhost:8000

``mkdocs.yml`` names this file as a hook. MkDocs collects ``docs/``; the hook lays the site out
like the repository instead (``README.md`` is the home page, ``docs/``, ``labs/NN_*/README.md``,
``notebooks/*.ipynb`` and ``figures/*.png`` keep their paths), so a relative link that works in
the repository, ``../../notebooks/01_collectives.ipynb`` in a lab's README, resolves on the site
as well, and ``--strict`` fails the build on one that resolves in neither. It also writes, in
memory, one page per lesson (its notebook, lab, reference and figures) and the reference pages,
each a mkdocstrings ``::: module`` block that renders the module's docstrings when the site is
built: the reference cannot drift from the code. Which lessons, notebooks, labs, figures and
packages: ``minipar.course.LESSONS``, nothing listed here a second time.

Needs the ``site`` extra (``pip install -e ".[site]"``); docs/site.md says why MkDocs.
"""
from __future__ import annotations

import pathlib

from minipar.course import LESSONS, lesson  # absolute: MkDocs loads this file as a hook, outside the package

ROOT = pathlib.Path(__file__).resolve().parents[2]

# the reference's pages beyond the lessons' packages: what every lab and notebook calls
CORE = [("minipar", "minipar.init and minipar.launch, the two calls a script or notebook starts with"),
        ("minipar.comm", "the communicator: minipar.init's backends"),
        ("minipar.comm.base", "the communicator's calls: send, recv, sendrecv, isend, irecv, split, region"),
        ("minipar.trace", "the trace every comm op and region writes"),
        ("minipar.launcher", "launch: a function on n real ranks, from Python")]


def lesson_packages() -> list[tuple[str, str]]:
    """(package, lesson key) for every lesson's library, in course order, from the registry."""
    return [(pkg, ls.key) for ls in LESSONS for pkg in ls.packages]


def reference_page(module: str) -> str:
    """The reference page of one module: a heading and the mkdocstrings block that renders it. A
    package that exports its names (``__all__``) shows them; one that does not, its modules."""
    init = ROOT / module.replace(".", "/") / "__init__.py"
    block = f"::: {module}\n"
    if init.exists() and "__all__" not in init.read_text():
        block += "    options:\n      show_submodules: true\n"
    return f"# `{module}`\n\n{block}"


def reference_index() -> str:
    rows = [f"| [`{m}`]({m}.md) | {what} |" for m, what in CORE]
    rows += [f"| [`{pkg}`]({pkg}.md) | lesson {key}: {lesson(key).title} |" for pkg, key in lesson_packages()]
    return ("# Reference\n\nRendered from the docstrings of the code when the site is built "
            "(mkdocstrings), so it says what the code says. The communicator's calls in a table: "
            "[the communicator](../docs/communicator.md).\n\n| module | what |\n|---|---|\n" + "\n".join(rows) + "\n")


def lesson_page(ls) -> str:
    """A lesson's page: its notebook, its lab, its library's reference, its figures."""
    lines = [f"# Lesson {ls.key}: {ls.title}", ""]
    if ls.notebook:
        lines.append(f"1. **The notebook:** [{pathlib.PurePath(ls.notebook).stem}](../{ls.notebook}), stored executed.")
    if ls.lab:
        lines.append(f"2. **The lab:** [{ls.lab}](../{ls.lab}/README.md), then `minipar lab start {ls.key}` "
                     f"and `minipar check {ls.key}`.")
    refs = ", ".join(f"[`{pkg}`](../reference/{pkg}.md)" for pkg in ls.packages)
    lines += [f"3. **The library it teaches:** {refs}.", "",
              f"On real ranks: `minipar run -n 4 {ls.run}`.", ""]
    if ls.figures:
        lines += ["## Figures", "", "Drawn from real runs (`minipar figures --into figures "
                  f"--only {ls.name}`; [every figure](../figures/README.md)).", ""]
        lines += [f"![{name}](../figures/{name})\n" for name in ls.figures]
    return "\n".join(lines) + "\n"


def repository_files() -> list[str]:
    """The repository's files the site shows, by their paths in the repository."""
    paths = ["README.md"]
    paths += sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").iterdir() if p.is_file())
    paths += [f"{ls.lab}/README.md" for ls in LESSONS if ls.lab]
    paths += [ls.notebook for ls in LESSONS if ls.notebook]
    paths += ["figures/README.md"] + sorted(f"figures/{p.name}" for p in (ROOT / "figures").glob("*.png"))
    return paths


def nav() -> list:
    """The site's menu: home, one section per lesson, the docs, the figures, the reference."""
    lessons = []
    for ls in LESSONS:
        entries = [{"Overview": f"lessons/{ls.key}_{ls.name}.md"}]
        if ls.notebook:
            entries.append({"Notebook": ls.notebook})
        if ls.lab:
            entries.append({"Lab": f"{ls.lab}/README.md"})
        lessons.append({f"{ls.key} {ls.name}": entries})
    docs = [{p.stem.replace("_", " "): p.relative_to(ROOT).as_posix()} for p in sorted((ROOT / "docs").glob("*.md"))]
    reference = ["reference/index.md"] + [f"reference/{m}.md" for m, _ in CORE]
    reference += [f"reference/{pkg}.md" for pkg, _ in lesson_packages()]
    return [{"Home": "README.md"}, {"Lessons": lessons}, {"Docs": docs},
            {"Figures": "figures/README.md"}, {"Reference": reference}]


# ---- the MkDocs hook (mkdocs.yml: hooks: [minipar/cli/website.py]) ----

def on_config(config):
    config["nav"] = nav()
    return config


_TMP = []


def _source_dir(path: str, root: pathlib.Path = ROOT) -> str:
    """Where the site reads ``path`` from: the repository, or for a notebook that stored its
    widgets' state, a copy without it. That state would make the page fetch the widget manager
    from a CDN (the site works offline); a widget's static fallback is what a page can show."""
    if not path.endswith(".ipynb"):
        return str(root)
    import json
    import tempfile

    nb = json.loads((root / path).read_text())
    if "widgets" not in nb.get("metadata", {}):
        return str(root)
    del nb["metadata"]["widgets"]
    if not _TMP:
        _TMP.append(tempfile.TemporaryDirectory(prefix="minipar-site-"))
    copy = pathlib.Path(_TMP[0].name) / path
    copy.parent.mkdir(parents=True, exist_ok=True)
    copy.write_text(json.dumps(nb))
    return _TMP[0].name


def on_post_build(config):
    while _TMP:
        _TMP.pop().cleanup()


def on_files(files, config):
    """Replace what MkDocs found in docs/ by the repository's layout and the generated pages.
    Runs before the plugins' on_files, so mkdocs-jupyter sees the notebooks."""
    from mkdocs.structure.files import File, Files

    # real files read from the repository (mkdocs-jupyter's wrapper needs src_dir, not a generated file)
    out = [File(path, _source_dir(path), config["site_dir"], config["use_directory_urls"]) for path in repository_files()]
    out += [File.generated(config, f"lessons/{ls.key}_{ls.name}.md", content=lesson_page(ls)) for ls in LESSONS]
    out.append(File.generated(config, "reference/index.md", content=reference_index()))
    out += [File.generated(config, f"reference/{m}.md", content=reference_page(m))
            for m in [m for m, _ in CORE] + [pkg for pkg, _ in lesson_packages()]]
    # the theme's own files (css, js, fonts) stay
    out += [f for f in files if f.src_dir != config["docs_dir"]]
    return Files(out)


on_files.mkdocs_priority = 100  # before the plugins (mkdocs.plugins.event_priority, without importing mkdocs here)
