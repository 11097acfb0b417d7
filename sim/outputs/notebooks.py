"""Run the notebooks in ``notebooks/`` at a chosen scale, read back the numbers they state, and
render them to HTML (docs/notebooks.md).

Every notebook has a code cell tagged ``parameters`` (``scale``, ``seed``, ``database_url``) that
holds its defaults. To run it at another scale, ``execute`` inserts a cell tagged
``injected-parameters`` right after it that assigns the new values — papermill's convention, done
here with nbclient alone. ``"full"`` is what the report renders; ``"ci"`` is what the tests run,
small enough for a minute on two cores.

A notebook states its key numbers in prose computed from the run, with ``state(numbers, text)``:
one display output whose ``text/markdown`` part is the sentence a reader sees and whose
``application/vnd.sim.numbers+json`` part carries the same numbers for machines. ``numbers(nb)``
merges those parts of an executed notebook, so the tests assert exactly what the text says, and
the HTML export shows only the markdown (nbconvert renders the richest type it knows).

``server(database_url)`` gives a notebook one PostgreSQL server for all its simulations: the URL
it was given (the tests pass their session cluster's) or an embedded cluster started once per
kernel and stopped when the kernel exits.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import math
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

NUMBERS_MIME = "application/vnd.sim.numbers+json"
SCALES = ("ci", "full")
INJECTED_TAG = "injected-parameters"
#: Seconds one cell may run before the execution fails (a bound, not a sleep).
CELL_TIMEOUT_S = 600

_embedded: Any = None


def server(database_url: str | None = None) -> str:
    """A PostgreSQL server URL for this kernel's simulations.

    Args:
        database_url: a server URL (its user may create databases), returned as it is; None
            starts an embedded cluster once per process and stops it at exit.

    Returns:
        A server URL for ``sim.run(..., database_url=...)`` and ``sim.plan(..., database_url=...)``.
    """
    global _embedded
    if database_url:
        return database_url
    if _embedded is None:
        from mediator.pg import EmbeddedPostgres

        _embedded = EmbeddedPostgres(database="postgres")
        atexit.register(_embedded.stop)
    return str(_embedded.url("postgres"))


def _plain(obj: Any) -> Any:
    """JSON-ready: numpy scalars to Python, non-finite floats to None (JSON has neither)."""
    if isinstance(obj, Mapping):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_plain(v) for v in obj]
    if hasattr(obj, "item") and callable(obj.item) and getattr(obj, "ndim", 1) == 0:
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def state(numbers: Mapping[str, Any], text: str) -> None:
    """Show `text` (markdown) in the notebook and carry `numbers` beside it for the tests.

    Args:
        numbers: the values the text states, by name (JSON-ready after numpy scalars become
            Python numbers; NaN and inf become null).
        text: the markdown a reader sees, written from the same values.
    """
    from IPython.display import display

    display({"text/markdown": text, NUMBERS_MIME: _plain(numbers)}, raw=True)


def numbers(nb: Any) -> dict[str, Any]:
    """Every number an executed notebook stated with ``state``, merged in cell order.

    Args:
        nb: an executed notebook (``nbformat.NotebookNode``).

    Returns:
        name → value; a later statement of the same name wins.
    """
    out: dict[str, Any] = {}
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if NUMBERS_MIME in data:
                value = data[NUMBERS_MIME]
                out.update(json.loads(value) if isinstance(value, str) else value)
    return out


def _parameters_index(nb: Any) -> int:
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code" and "parameters" in cell.get("metadata", {}).get("tags", []):
            return i
    raise ValueError("the notebook has no code cell tagged 'parameters'")


def inject(nb: Any, parameters: Mapping[str, Any]) -> Any:
    """Insert a cell assigning `parameters` right after the ``parameters`` cell (papermill's
    ``injected-parameters`` convention); an earlier injected cell is replaced.

    Args:
        nb: the notebook (changed in place).
        parameters: name → value; values must have a Python literal ``repr``.

    Returns:
        The notebook.
    """
    import nbformat

    nb.cells = [c for c in nb.cells if INJECTED_TAG not in c.get("metadata", {}).get("tags", [])]
    at = _parameters_index(nb)
    if parameters:
        source = "# Parameters injected by sim.outputs.notebooks\n" + "".join(
            f"{name} = {value!r}\n" for name, value in parameters.items()
        )
        cell = nbformat.v4.new_code_cell(source, metadata={"tags": [INJECTED_TAG]})
        nb.cells.insert(at + 1, cell)
    return nb


def execute(
    book: str | os.PathLike[str],
    parameters: Mapping[str, Any] | None = None,
    *,
    timeout: int = CELL_TIMEOUT_S,
    progress: bool = False,
) -> Any:
    """Execute a notebook with explicit parameters in a fresh kernel.

    Args:
        book: the ``.ipynb`` file (left unchanged).
        parameters: overrides for the ``parameters`` cell, e.g. ``{"scale": "ci"}``.
        timeout: seconds any one cell may take.
        progress: show a progress bar over the code cells (tqdm, on stderr).

    Returns:
        The executed notebook (``nbformat.NotebookNode``), outputs included.
    """
    import nbformat
    from nbclient import NotebookClient
    from traitlets.config import Config

    path = Path(book)
    nb = inject(nbformat.read(path, as_version=4), dict(parameters or {}))
    bar: Any = None
    with tempfile.TemporaryDirectory(prefix="sim-kernel-") as sockets:
        # Talk to the kernel over unix sockets, not loopback TCP: no ports, nothing to
        # eavesdrop on (ipykernel warns about unencrypted TCP).
        config = Config()
        config.KernelManager.transport = "ipc"
        config.KernelManager.ip = os.path.join(sockets, "kernel")
        client = NotebookClient(
            nb,
            timeout=timeout,
            kernel_name="python3",
            config=config,
            resources={"metadata": {"path": str(path.parent.resolve())}},
        )
        if progress:
            from tqdm import tqdm

            code = sum(c.cell_type == "code" for c in nb.cells)
            bar = tqdm(total=code, desc=path.stem, unit="cell")
            client.on_cell_executed = lambda **_: bar.update()
        try:
            client.execute()
        finally:
            if bar is not None:
                bar.close()
    return nb


def run(
    book: str | os.PathLike[str], scale: str = "ci", **parameters: Any
) -> tuple[Any, dict[str, Any]]:
    """Execute a notebook at `scale` and return it with the numbers it stated (for tests).

    Args:
        book: the ``.ipynb`` file.
        scale: ``"ci"`` or ``"full"``.
        **parameters: other parameter overrides (``seed``, ``database_url``).

    Returns:
        (the executed notebook, its ``numbers``).
    """
    if scale not in SCALES:
        raise ValueError(f"scale {scale!r} not in {SCALES}")
    nb = execute(book, {"scale": scale, **parameters})
    return nb, numbers(nb)


def to_html(nb: Any) -> str:
    """An executed notebook as a standalone HTML page (nbconvert's lab template; charts inline)."""
    from nbconvert import HTMLExporter

    body, _ = HTMLExporter(template_name="lab").from_notebook_node(nb)
    return str(body)


def render(
    book: str | os.PathLike[str],
    out: str | os.PathLike[str],
    scale: str = "full",
    database_url: str | None = None,
    progress: bool = True,
    parameters: Mapping[str, Any] | None = None,
) -> Path:
    """Execute a notebook at `scale` and write it as ``out/<name>.html`` (the report's step).

    Args:
        book: the ``.ipynb`` file.
        out: the directory to write into (created if missing).
        scale: ``"full"`` for the report, ``"ci"`` for a quick look.
        database_url: a PostgreSQL server for the notebook's simulations; None lets the notebook
            start its own embedded cluster.
        progress: show a progress bar over the notebook's cells while it runs.
        parameters: other parameter overrides (the report's ``capacity_dir``). A path inside
            `out` is shown on the page relative to it, as a reader of the folder sees it.

    Returns:
        The HTML file's path.
    """
    if scale not in SCALES:
        raise ValueError(f"scale {scale!r} not in {SCALES}")
    params: dict[str, Any] = {"scale": scale, **(parameters or {})}
    if database_url is not None:
        params["database_url"] = database_url
    nb = execute(book, params, progress=progress)
    target = Path(out)
    target.mkdir(parents=True, exist_ok=True)
    shown = {}
    for value in (parameters or {}).values():
        if isinstance(value, str) and Path(value).is_absolute():
            with contextlib.suppress(ValueError):  # not inside out: shown as it is
                shown[value] = Path(value).relative_to(target.resolve()).as_posix()
    path = target / f"{Path(book).stem}.html"
    path.write_text(to_html(conceal(nb, database_url, shown)), encoding="utf-8")
    return path


def parameter_names(book: str | os.PathLike[str]) -> set[str]:
    """The names a notebook's ``parameters`` cell assigns (what ``execute`` may override)."""
    import ast

    import nbformat

    nb = nbformat.read(Path(book), as_version=4)
    tree = ast.parse(nb.cells[_parameters_index(nb)].source)
    return {t.id for node in tree.body if isinstance(node, ast.Assign)
            for t in node.targets if isinstance(t, ast.Name)}  # fmt: skip


#: What a rendered notebook shows instead of the server URL it was given.
CONCEALED_URL = "<the report's PostgreSQL server>"


def conceal(nb: Any, database_url: str | None, shown: Mapping[str, str] | None = None) -> Any:
    """The executed notebook as a reader should see it: the database URL it was given — a
    temporary socket directory, perhaps a password — replaced by ``CONCEALED_URL`` in the
    injected parameters and in every output (the URL means nothing to a reader and must not
    leak into a published page).

    Args:
        nb: an executed notebook (changed in place).
        database_url: the URL to hide; None hides nothing.
        shown: other texts to show otherwise (a folder of the report, as a reader finds it).

    Returns:
        The notebook.
    """
    swaps = dict(shown or {})
    if database_url:
        swaps[database_url] = CONCEALED_URL
    if not swaps:
        return nb

    def scrub(text: str) -> str:
        for hidden, instead in swaps.items():
            text = text.replace(repr(hidden), repr(instead)).replace(hidden, instead)
        return text

    for cell in nb.cells:
        cell.source = scrub(cell.source)
        for output in cell.get("outputs", []):
            if "text" in output:
                output["text"] = scrub(output["text"])
            for mime, value in output.get("data", {}).items():
                if isinstance(value, str):
                    output["data"][mime] = scrub(value)
    return nb
