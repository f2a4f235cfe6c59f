"""What a worker process starts from besides the fork server: the parent's current environment, and
the check that the workers can import the script that started the run."""

from __future__ import annotations

import os


def check_main_importable() -> None:
    """Raises, before any work, when the script that started the run has no file (standard input,
    ``-c``): every worker imports it and would die starting."""
    import sys

    from quantune.errors import QuantuneError

    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if getattr(getattr(main, "__spec__", None), "name", None) is None and path and not os.path.isfile(path):
        raise QuantuneError(
            f"executor: worker processes re-import the script that started the run, and '{path}' is no "
            "file (a script read from standard input): save it to a .py file and run that, or set "
            "executor.kind: inline"
        )


def child_environment() -> dict[str, str]:
    """The environment a worker must see: the parent's, now (the fork server's is its own, older)."""
    return dict(os.environ)


def adopt_environment(environment: dict[str, str] | None) -> None:
    """In the worker, first: the parent's environment replaces the fork server's."""
    if environment is None:
        return
    os.environ.clear()
    os.environ.update(environment)
