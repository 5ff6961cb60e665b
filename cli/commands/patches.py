"""`specgauge patches list|overlay`: vLLM source overlays (patches/) for containers on a cluster."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

OVERLAY_HELP = "\n\n".join(
    [
        "Apply patches/*.patch to a copy of just the vLLM files they touch, and print the container mounts.",
        "--vllm-src is the vLLM the container runs, readable here: a site-packages directory, a vLLM "
        "checkout, or the vllm package itself (e.g. copied out of the image). Patches apply without fuzz: one "
        "that does not fit this vLLM fails, naming its hunks.",
        "OUT gets the patched files at OUT/<relpath> (relpath inside the vllm package) and overlay.json (patch "
        "names and sha256, files and hashes). The launchers read overlay.json (spec: launcher.overlay: OUT), "
        "upload the files, add the mounts and record the overlay in the deployment's provenance.",
        "Printed, one a line: OUT/<relpath>:<site-packages>/vllm/<relpath>, the form pyxis' "
        "--container-mounts and an environment TOML's mounts take. --site-packages is where the container's "
        "vllm package lives (the pinned Apertus image: /workspace/vllm, a source checkout).",
    ]
)


def register(app: typer.Typer) -> None:
    patches_app = typer.Typer(
        help="vLLM source overlays: patched copies of vLLM files mounted over the originals in a container.",
        no_args_is_help=True,
    )
    app.add_typer(patches_app, name="patches")

    @patches_app.command("list")
    def list_patches() -> None:
        """List the patches in patches/: name, files touched, vLLM versions targeted, sha256."""
        from tasks.launch.overlay import available_patches

        for patch in available_patches().values():
            typer.echo(f"{patch.name}  sha256:{patch.sha256[:16]}")
            typer.echo(f"  files:   {', '.join(patch.files)}")
            typer.echo(f"  targets: {patch.headers.get('Targets', '(not stated)')}")

    @patches_app.command("overlay", help=OVERLAY_HELP)
    def overlay(
        vllm_src: Annotated[
            Path, typer.Option("--vllm-src", help="vLLM source: site-packages, checkout or package.")
        ],
        out: Annotated[Path, typer.Option("--out", help="New (or empty) directory for the patched files.")],
        patch: Annotated[
            list[str] | None,
            typer.Option("--patch", help="Patch name (repeatable); default: all in patches/."),
        ] = None,
        site_packages: Annotated[
            str,
            typer.Option(
                "--site-packages", help="Container directory holding the vllm package (mount targets)."
            ),
        ] = "/usr/local/lib/python3.12/dist-packages",
    ) -> None:
        from tasks.launch.overlay import build_overlay

        built = build_overlay(
            vllm_src, out, patch or None, container_vllm_dir=f"{site_packages.rstrip('/')}/vllm"
        )
        names = ", ".join(f"{p['name']} ({p['sha256'][:12]})" for p in built.patches)
        typer.echo(
            f"# vLLM {built.vllm_version or '(version unknown)'} at {built.vllm_src}; applied: {names}",
            err=True,
        )
        typer.echo(f"# manifest: {Path(built.root) / 'overlay.json'}", err=True)
        for mount in built.mounts():
            typer.echo(mount)
