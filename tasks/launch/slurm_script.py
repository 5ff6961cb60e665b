"""The text a SLURM launch sends: the batch script (tasks/launch/templates/vllm.sbatch), the container
prefix, the container environment TOML with its mounts. Pure functions: nothing here runs anything."""

from __future__ import annotations

import re
import shlex
import string
import tomllib
from pathlib import Path

from experiments.spec import TargetSpec
from specgauge.errors import InputError
from tasks.launch.config import ENV_NAME, SAFE_NAME, SAFE_PATH, ClusterConfig
from tasks.launch.ssh import quote

TEMPLATE = Path(__file__).parent / "templates" / "vllm.sbatch"
# The engine command's port when the cluster's port is 0: the job picks a free port on its node (several
# slots of a campaign may share a node) and the script puts it here.
JOB_PORT = "SPECGAUGE_JOB_PORT"


def render_prefix(template: str, *, mounts: list[str], environment: str | None) -> str:
    """Fill {mounts} (comma-separated) and {environment} into the container prefix; a word whose
    placeholder has no value is left out (so an unused `--container-mounts={mounts}` disappears)."""
    words = []
    for word in shlex.split(template):
        names = set(re.findall(r"\{(\w+)\}", word))
        if ("mounts" in names and not mounts) or ("environment" in names and not environment):
            continue
        words.append(word.format(mounts=",".join(mounts), environment=environment or ""))
    return " ".join(shlex.quote(w) for w in words)


def with_layout_gpus(cluster: ClusterConfig, target: TargetSpec) -> ClusterConfig:
    """The cluster settings for one deployment: a target spread over several GPUs (tensor x data parallel,
    e.g. a layout of a sweep) asks for that many per node; a single-GPU target keeps the cluster's own."""
    gpus = target.tensor_parallel_size * target.data_parallel_size
    if gpus <= 1 or gpus == cluster.gpus_per_node:
        return cluster
    return cluster.model_copy(update={"gpus_per_node": gpus})


def render_script(
    *,
    deployment_id: str,
    job_name: str,
    run_dir: str,
    cluster: ClusterConfig,
    engine_command: list[str],
    env: dict[str, str],
    launch_prefix: str = "",
    node: str | None = None,
) -> str:
    """The batch script from the template; every value that reaches the shell is validated or quoted."""
    if not SAFE_PATH.fullmatch(run_dir):
        raise InputError(f"run directory {run_dir!r}: paths may hold letters, digits and ._/~+@=- only")
    options = []
    if cluster.partition:
        options.append(f"--partition={cluster.partition}")
    if cluster.account:
        options.append(f"--account={cluster.account}")
    options.append(f"--time={cluster.time_limit}")
    if cluster.gpus_per_node:
        options.append(f"--gpus-per-node={cluster.gpus_per_node}")
    if cluster.cpus_per_task:
        options.append(f"--cpus-per-task={cluster.cpus_per_task}")
    if cluster.memory:
        options.append(f"--mem={cluster.memory}")
    if node:
        if not SAFE_NAME.fullmatch(node):
            raise InputError(f"node {node!r}: node names may hold letters, digits and ._- only")
        options.append(f"--nodelist={node}")
    options.extend(cluster.extra_sbatch)
    for name in env:
        if not ENV_NAME.fullmatch(name):
            raise InputError(f"environment variable name {name!r} is not valid")
    values = {
        "deployment_id": deployment_id,
        "job_name": job_name,
        "run_dir": run_dir,
        "run_dir_quoted": quote(run_dir),
        "sbatch_options": "\n".join(f"#SBATCH {o}" for o in options),
        "port": str(cluster.port),
        "setup": "\n".join(cluster.setup),
        "exports": "\n".join(f"export {k}={quote(v)}" for k, v in sorted(env.items())),
        "launch_prefix": f"{launch_prefix} " if launch_prefix else "",
        "engine_command": " ".join('"$port"' if w == JOB_PORT else quote(w) for w in engine_command),
    }
    return string.Template(TEMPLATE.read_text()).substitute(values)


def resolve_arch(text: str, arch: str) -> str:
    return text.replace("{arch}", arch)


def add_mounts(text: str, mounts: list[str], source: str) -> str:
    """Add container mounts to an environment TOML's `mounts` array (textually, keeping comments)."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{source}: invalid TOML: {exc}") from None
    if not mounts:
        return text
    for mount in mounts:
        if any(c in mount for c in '"\\\n'):
            raise InputError(f"mount {mount!r} holds a quote, backslash or newline")
    entries = "".join(f'  "{m}",\n' for m in mounts)
    found = re.search(r"^mounts\s*=\s*\[", text, re.MULTILINE)
    if found:
        text = text[: found.end()] + "\n" + entries + text[found.end() :]
    elif "mounts" in data:
        raise InputError(f"{source}: 'mounts' is not a top-level array the launcher can extend")
    else:
        table = re.search(r"^\[", text, re.MULTILINE)
        block = f"mounts = [\n{entries}]\n"
        text = text[: table.start()] + block + "\n" + text[table.start() :] if table else text + "\n" + block
    merged = tomllib.loads(text).get("mounts", [])
    assert all(m in merged for m in mounts)
    return text
