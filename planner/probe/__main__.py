"""`python -m planner.probe probe ...`: the probe command without the core CLI."""

import typer

from planner.probe.command import register

app = typer.Typer(add_completion=False, no_args_is_help=True)


@app.callback()
def _root() -> None:
    """parallel-planner link probe."""


register(app)

if __name__ == "__main__":
    app()
