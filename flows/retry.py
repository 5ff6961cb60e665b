"""Which failures are worth a retry: transient ones (connection errors, 5xx, a launch that died on its
node), never deterministic ones (bad input, 4xx)."""

import httpx

from specgauge.errors import InputError, LaunchError


def transient_exception(exc: BaseException | None) -> bool:
    if exc is None or isinstance(exc, InputError):
        return False
    if isinstance(exc, LaunchError):
        return exc.transient
    if isinstance(exc, httpx.HTTPStatusError):
        return exc.response.status_code >= 500
    if isinstance(exc, httpx.TransportError | ConnectionError | TimeoutError):
        return True
    try:
        from filelock import Timeout as LockTimeout
    except ImportError:  # pragma: no cover
        return False
    return isinstance(exc, LockTimeout)


def is_transient(task, task_run, state) -> bool:
    """Prefect retry_condition_fn: retry only what may succeed the next time."""
    try:
        state.result(raise_on_failure=True)
    except BaseException as exc:  # the task's own exception, re-raised by Prefect
        return transient_exception(exc)
    return False
