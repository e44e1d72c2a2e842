"""What the CLI modules share: one-line errors, exit codes and groups of options.

A group of options (the storage flags of ``serve`` and ``recover``, the admin
address and token of every client command) is declared once, as a list of
parameters, and added to each command by :func:`with_options`; the command
receives one value built from them (a Config, an API session) instead of
repeating the same parameter block.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any, NoReturn, get_type_hints

import typer

EXIT_FAILED = 1  # the gateway or the API said no; a job failed
EXIT_USAGE = 2  # what the user typed or configured is wrong (click uses 2 as well)
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what shells expect after Ctrl-C


def fail(message: str, code: int) -> NoReturn:
    """Print ``tierstore: <message>`` on stderr and exit: a user-fixable error, no traceback."""
    typer.echo(f"tierstore: {message}", err=True)
    raise typer.Exit(code)


def option(name: str, annotation: object, default: object = None) -> inspect.Parameter:
    """One option of a group; ``annotation`` is an ``Annotated[..., typer.Option(...)]``."""
    return inspect.Parameter(
        name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation
    )


def with_options(
    name: str,
    params: Sequence[inspect.Parameter],
    make: Callable[..., AbstractContextManager[Any]],
) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Replace a command's parameter ``name`` by the options ``params``.

    Typer reads the options from the signature of the returned function; when
    the command runs, their values go to ``make``, and what its context
    manager yields is passed as ``name``. Decorators can be stacked.
    """

    def decorate(command: Callable[..., None]) -> Callable[..., None]:
        signature = inspect.signature(command)
        # Typer needs real annotations, not the strings `from __future__ import annotations` leaves.
        hints = get_type_hints(command, include_extras=True)
        own = [
            p.replace(annotation=hints.get(p.name, p.annotation))
            for p in signature.parameters.values()
            if p.name != name
        ]
        names = [p.name for p in params]

        def run(**kwargs: Any) -> None:
            values = {key: kwargs.pop(key) for key in names}
            with make(**values) as bundle:
                command(**kwargs, **{name: bundle})

        functools.update_wrapper(run, command, updated=())
        parameters = [*own, *params]
        run.__signature__ = signature.replace(  # type: ignore[attr-defined]
            parameters=parameters, return_annotation=None
        )
        run.__annotations__ = {p.name: p.annotation for p in parameters}
        return run

    return decorate
