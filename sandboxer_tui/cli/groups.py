"""A click group with a default subcommand, for `sbx events`, `sbx checkpoints` and
`sbx evidence`."""

from __future__ import annotations

from typing import Any

import click


class DefaultGroup(click.Group):
    """A group that runs `default_command` when the first word is not a subcommand,
    so `sbx events ID` and `sbx events verify` both work."""

    def __init__(self, *args: Any, default_command: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.default_command = default_command

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if not args or args[0] not in self.commands:
            if not any(a in ("--help", "-h") for a in args[:1]):
                args = [self.default_command, *args]
        return super().parse_args(ctx, args)
