"""`specgauge blocks register`: make specgauge's block types known to the Prefect API in use."""

from __future__ import annotations

import importlib
import pkgutil

import typer

import blocks


def block_modules() -> list[str]:
    return sorted(
        f"blocks.{m.name}" for m in pkgutil.iter_modules(blocks.__path__) if not m.name.startswith("_")
    )


def register(app: typer.Typer) -> None:
    blocks_app = typer.Typer(
        help="Prefect blocks: cluster SSH, SLURM cluster, endpoint, warehouse.", no_args_is_help=True
    )
    app.add_typer(blocks_app, name="blocks")

    @blocks_app.command("register")
    def register_blocks(
        default_warehouse: bool = typer.Option(
            True, help="Also save a 'default' warehouse block pointing at this checkout's warehouse."
        ),
    ) -> None:
        """Register every block type in blocks/ with the Prefect API (the active profile's)."""
        from prefect.blocks.core import Block

        from specgauge.settings import get_settings

        registered = []
        for name in block_modules():
            module = importlib.import_module(name)
            for obj in vars(module).values():
                if isinstance(obj, type) and issubclass(obj, Block) and obj.__module__ == name:
                    obj.register_type_and_schema()
                    registered.append(obj.get_block_type_slug())
        if default_warehouse:
            from blocks.warehouse import WarehouseBlock

            settings = get_settings()
            WarehouseBlock(path=str(settings.warehouse_path), raw_dir=str(settings.raw_dir)).save(
                "default", overwrite=True
            )
            registered.append("specgauge-warehouse/default (saved)")
        for slug in registered:
            typer.echo(f"registered {slug}")
