"""What a run learns from a store's labels: **regression** (numbers: squared error, validation
MAE and RMSE) or **classification** (class indices: cross-entropy, validation accuracy and
per-class counts). Which task a store's labels get, the checks they must pass, and each task's
loss, validation figures and baseline.

With no task asked for, a store whose metadata lists its classes (``meta["class_names"]``, what
packing class folders writes) is classified; any other store is regressed, int64 labels (a
labels CSV of whole numbers, such as ages) as numbers.
"""

from __future__ import annotations

import math
import warnings
from typing import List, Optional

import numpy as np
import torch
import torch.nn.functional as F

from fastload.options import TASKS
from fastload.store import Store

REGRESSION, CLASSIFICATION = TASKS
# Classes made from the labels of a store that lists none (max label + 1): beyond this the
# labels are far more likely numbers (counts, ids) than class indices.
MAX_UNNAMED_CLASSES = 1000
# What patience watches per task (lower is better) and its name in messages.
PATIENCE_FIGURES = {
    REGRESSION: ("val_rmse", "validation RMSE"),
    CLASSIFICATION: ("val_loss", "validation loss"),
}


def listed_classes(store: Store) -> Optional[List[str]]:
    """The class names the store's metadata lists, or None."""
    names = store.meta.get("class_names")
    return [str(name) for name in names] if isinstance(names, list) else None


def choose_task(requested: Optional[str], store: Store) -> str:
    """The task of a run training on ``store``: ``requested``, or the rule of this module's
    docstring when None. Classifying real-valued labels is refused."""
    if requested is None:
        listed = store.label_dtype == np.int64 and listed_classes(store) is not None
        return CLASSIFICATION if listed else REGRESSION
    if requested == CLASSIFICATION and store.label_dtype != np.int64:
        raise ValueError(
            f"store {store.path} has {store.label_dtype} labels; classification needs int64 class "
            "indices (pack class folders, or a labels CSV of whole numbers), or use task regression"
        )
    return requested


def class_names(train_store: Store, val_store: Optional[Store]) -> List[str]:
    """The classes of a classification run: those the training store lists or, when it lists
    none, ``0 .. its largest label`` (with a warning saying so). Refuses a separate validation
    store whose labels are not class indices or whose listed classes differ, and fewer than 2
    classes."""
    names = listed_classes(train_store)
    if val_store is not None:
        if val_store.label_dtype != np.int64:
            raise ValueError(
                f"validation store {val_store.path} has {val_store.label_dtype} labels; "
                "classification needs int64 class indices"
            )
        val_names = listed_classes(val_store)
        if val_names != names:
            raise ValueError(
                f"validation store {val_store.path} lists {_classes(val_names)}, the training store "
                f"{train_store.path} {_classes(names)}; validate on a store packed with the same class folders"
            )
    if names is None:
        labels = np.asarray(train_store.labels)
        if labels.min() < 0:
            raise ValueError(
                f"store {train_store.path} lists no classes and has negative labels "
                f"(smallest {int(labels.min()):,}); class indices start at 0: use task regression"
            )
        count = int(labels.max()) + 1
        if count > MAX_UNNAMED_CLASSES:
            raise ValueError(
                f"store {train_store.path} lists no classes and has labels up to {count - 1:,}: "
                f"classifying them would make {count:,} classes (at most {MAX_UNNAMED_CLASSES:,} without "
                "class names); they look like numbers: use task regression"
            )
        warnings.warn(
            f"store {train_store.path} lists no class names: its int64 labels are classified as "
            f"{count} classes, 0 to {count - 1} (the largest label + 1)",
            stacklevel=2,
        )
        names = [str(i) for i in range(count)]
    if len(names) < 2:
        raise ValueError(f"store {train_store.path} has {len(names)} class; classification needs at least 2")
    return names


def _classes(names: Optional[List[str]]) -> str:
    if names is None:
        return "no classes"
    shown = ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")
    return f"{len(names)} classes ({shown})"


def check_class_labels(what: str, path, labels: np.ndarray, count: int) -> None:
    """Refuses labels that are not indices of one of ``count`` classes."""
    outside = np.unique(labels[(labels < 0) | (labels >= count)])
    if len(outside):
        shown = ", ".join(str(v) for v in outside[:5].tolist()) + (", ..." if len(outside) > 5 else "")
        raise ValueError(
            f"{what} {path} has labels outside [0, {count}) ({shown}); a class index must be one of "
            f"its {count} classes"
        )


def label_dtype(task: str) -> torch.dtype:
    """The dtype a batch's labels have on the device: class indices or real targets."""
    return torch.long if task == CLASSIFICATION else torch.float32


def loss(task: str, pred: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """A batch's training loss: mean squared error, or the cross-entropy of the logits."""
    if task == CLASSIFICATION:
        return F.cross_entropy(pred.float(), y)
    return F.mse_loss(pred.float(), y)


def validation_sums(task: str, pred: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """One validation batch's sums, float64, to be added over the batches and read by
    :func:`validation_metrics`: (absolute errors, squared errors) for regression; for
    classification the cross-entropy, then the records of each class, then the correct ones."""
    if task == REGRESSION:
        err = pred.double() - y.double()
        return torch.stack([err.abs().sum(), err.square().sum()])
    logits = pred.double()
    members = F.one_hot(y, logits.shape[1]).double()  # exact counts, deterministic on any device
    correct = members * (logits.argmax(1) == y)[:, None]
    cross_entropy = F.cross_entropy(logits, y, reduction="sum")
    return torch.cat([cross_entropy[None], members.sum(0), correct.sum(0)])


def validation_metrics(task: str, sums: torch.Tensor, count: int) -> dict:
    """The validation figures of an epoch from its summed :func:`validation_sums` over
    ``count`` records."""
    values = sums.tolist()
    if task == REGRESSION:
        abs_sum, sq_sum = values
        return {"val_mae": abs_sum / count, "val_rmse": math.sqrt(sq_sum / count)}
    classes = (len(values) - 1) // 2
    correct = [round(v) for v in values[1 + classes :]]
    return {
        "val_loss": values[0] / count,
        "val_accuracy": sum(correct) / count,
        "val_support": [round(v) for v in values[1 : 1 + classes]],
        "val_correct": correct,
    }


def baseline(task: str, train_labels: np.ndarray, val_labels: np.ndarray) -> dict:
    """What a model that ignores the images scores on validation: always the training labels'
    mean (its RMSE), or always their most frequent class (its accuracy)."""
    if task == REGRESSION:
        return {"baseline_rmse": float(np.sqrt(np.mean((val_labels - train_labels.mean()) ** 2)))}
    majority = np.bincount(train_labels).argmax()
    return {"baseline_accuracy": float(np.mean(val_labels == majority))}


#: A final validation error less than this far below the baseline's is "not clearly better".
CLEARLY_BETTER = 0.05
#: A final training loss above this share of the first epoch's did not fall: the learning rate
#: is the likely cause of learning nothing.
LOSS_FELL = 0.95
#: Below this many training records, too few records is the likely cause of learning nothing.
FEW_RECORDS = 1000
#: Below this many epochs, too few epochs is.
FEW_EPOCHS = 10


def learned_too_little(task: str, history: list, train_records: int, epochs: int) -> Optional[str]:
    """One line saying that the latest epoch's validation error is not clearly better (less
    than CLEARLY_BETTER below) than the baseline's, with its likely cause: the learning rate
    when the training loss did not fall, else too few records, else too few epochs; None when
    the model beats the baseline clearly."""
    last = history[-1]
    if task == REGRESSION:
        error, base, what = (
            last["val_rmse"],
            last["baseline_rmse"],
            "RMSE {:.4g} against the mean baseline's {:.4g}",
        )
    else:
        error, base = 1 - last["val_accuracy"], 1 - last["baseline_accuracy"]
        what = "error rate {:.1%} against the majority baseline's {:.1%}"
    if error < (1 - CLEARLY_BETTER) * base:
        return None
    if len(history) >= 2 and last["train_loss"] >= LOSS_FELL * history[0]["train_loss"]:
        cause = "the training loss did not fall: try another learning rate (--lr, 10x lower or higher)"
    elif train_records < FEW_RECORDS:
        cause = f"too few records ({train_records:,} to train on)"
    elif epochs < FEW_EPOCHS:
        cause = f"too few epochs ({epochs}): train longer (--epochs)"
    else:
        cause = "the learning rate (--lr) or too little signal in the images for this model"
    return (
        f"the model learned little: validation {what.format(error, base)}, not {CLEARLY_BETTER:.0%} "
        f"better; likely {cause}"
    )
