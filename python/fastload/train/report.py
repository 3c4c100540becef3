"""How a run's epochs are reported: a human line (:func:`format_epoch`) or JSON, on stdout and
optionally appended to a file (:func:`epoch_logger`, the ``log`` of :func:`~fastload.train.fit`).
A fit_many group's runs side by side are :func:`fastload.train.runs.runs_table`."""

from __future__ import annotations

import json
import re
import sys
from typing import Optional, TextIO

from fastload._checks import fspath
from fastload.files import append_text
from fastload.store import PathLike

# Classes an epoch line shows their counts for (the JSON log has every class): all of them up to
# this many, else this many of the least accurate.
CLASSES_SHOWN = 10


def format_epoch(metrics: dict) -> str:
    """One human-readable line for an epoch's metrics (or a run's early stop), led by the run's
    name in a fit_many group; after the final epoch, a second line when the model did not
    clearly beat the baseline."""
    run = f"{metrics['run']}  " if "run" in metrics else ""
    if "stopped" in metrics:
        return f"{run}stopped at step {metrics['step']}: {metrics['stopped']}"
    line = run + f"epoch {metrics['epoch']}/{metrics['epochs']}  train loss {metrics['train_loss']:.4g}  "
    if "val_accuracy" in metrics:
        line += (
            f"val loss {metrics['val_loss']:.4g}  accuracy {100 * metrics['val_accuracy']:.1f}% "
            f"(majority baseline {100 * metrics['baseline_accuracy']:.1f}%)  "
        )
    else:
        line += (
            f"val MAE {metrics['val_mae']:.4g}  RMSE {metrics['val_rmse']:.4g} "
            f"(mean baseline {metrics['baseline_rmse']:.4g})  "
        )
    if "images_per_s_all_runs" in metrics:  # a run of a fit_many group: each trains on every batch
        line += f"{metrics['images_per_s']:,.0f} img/s per run ({metrics['images_per_s_all_runs']:,.0f} all runs)  "
    else:
        line += f"{metrics['images_per_s']:,.0f} img/s  "
    line += f"data wait {100 * metrics['data_wait_fraction']:.1f}%"
    if "gpu_max_memory_bytes" in metrics:
        line += f"  GPU memory {metrics['gpu_max_memory_bytes'] / 2**30:.2f} GiB"
    if "gpu_utilization_percent" in metrics:
        line += f"  GPU busy {metrics['gpu_utilization_percent']}%"
    if "val_accuracy" in metrics:
        line += "  " + _class_counts(
            metrics["val_correct"], metrics["val_support"], metrics.get("class_names")
        )
    if "learned_too_little" in metrics:
        line += f"\n{run}warning: {metrics['learned_too_little']}"
    return line


def _class_counts(correct: list, support: list, names: Optional[list] = None) -> str:
    """Correct/records per validation class, by name (by index without ``names``): every class,
    or the least accurate ones (a class without validation records has no accuracy, so it comes
    after every class that has one)."""
    classes = list(range(len(support)))
    names = names if names is not None and len(names) == len(support) else [str(c) for c in classes]
    shown = "correct per class"
    if len(classes) > CLASSES_SHOWN:
        classes = sorted(classes, key=lambda c: (support[c] == 0, correct[c] / max(support[c], 1)))
        classes = classes[:CLASSES_SHOWN]
        shown = f"least accurate {CLASSES_SHOWN} of {len(support)} classes"
    return f"{shown}: " + " ".join(f"{names[c]}:{correct[c]}/{support[c]}" for c in classes)


#: PyTorch's warning when vmap (``fit_many(stack=True)``) meets an operation it has no batched
#: kernel for; its "Please file us an issue on GitHub" is addressed to PyTorch's users.
VMAP_FALLBACK = re.compile(
    r"There is a performance drop because we have not yet implemented the batching rule for (\S+?)\.? "
)


def explain_warning(message: str) -> str:
    """A warning raised while training, in fastload's words where it is one PyTorch addresses
    to its own users (the vmap fallback of stacked runs), else unchanged."""
    fallback = VMAP_FALLBACK.search(message)
    if fallback is None:
        return message
    return (
        f"stacked runs: PyTorch's vmap has no batched kernel for {fallback.group(1)}, so it computes "
        "that operation one run at a time: the results are the same, the speed-up of --stack is "
        "smaller (PyTorch's own message asks to report this to PyTorch, not to fastload)"
    )


def epoch_logger(
    json_lines: bool = False, json_log: Optional[PathLike] = None, stream: Optional[TextIO] = None
):
    """A ``log`` callable for :func:`fit`: a line per epoch on ``stream`` (default: the current
    stdout; JSON or human) and, with ``json_log``, a JSON line appended to that file, which is
    opened (created if missing) now, so an unwritable path fails before the first epoch. The
    log follows the output rule (:func:`fastload.files.append_text`): a device, FIFO or folder
    is refused, a symbolic link written through, and a failed write names the file."""
    if json_log is not None:
        json_log = fspath(json_log, "json_log")
        append_text(json_log, "", "JSON log")

    def log(metrics: dict) -> None:
        line = json.dumps(metrics)
        out = sys.stdout if stream is None else stream
        out.write((line if json_lines else format_epoch(metrics)) + "\n")
        out.flush()
        if json_log is not None:
            append_text(json_log, line + "\n", "JSON log")

    return log
